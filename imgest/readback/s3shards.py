"""Streaming webdataset shards from S3: whole-shard GETs in parallel, tars parsed in memory, a shuffle buffer.

The read path the S3-shard prior art describes: a pool of ``parallel_shards`` threads each GETs a whole shard
object (one request, no per-sample round trips), the tar is parsed from memory, and samples pass through a
seeded shuffle buffer of ``shuffle_buffer`` samples that spans several shards. ``shard_id`` / ``num_shards``
split the shard list between training processes.
"""

from __future__ import annotations

import io
import json
import logging
import random
import tarfile
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from imgest.core.errors import ImgestError
from imgest.core.settings import S3Settings

log = logging.getLogger(__name__)
Sample = tuple[np.ndarray, int, str, dict[str, Any]]  # image bytes, label, key, json member


class ShardReadError(ImgestError):
    """A shard could not be fetched or parsed."""


@dataclass(frozen=True)
class S3StreamOptions:
    """Knobs of the streaming shard reader."""

    batch_size: int = 64
    parallel_shards: int = 4  # whole-shard GETs in flight
    shuffle_buffer: int = 0  # samples; 0 keeps shard order
    seed: int = 0
    shard_id: int = 0
    num_shards: int = 1
    retries: int = 3


def tar_samples(data: bytes, where: str) -> Iterator[Sample]:
    """Samples (image, label, key, meta) of an in-memory webdataset tar, grouped by key."""
    members: dict[str, dict[str, bytes]] = {}
    order: list[str] = []
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for info in tar:
                if not info.isfile():
                    continue
                key, _, ext = info.name.partition(".")
                if key not in members:
                    members[key] = {}
                    order.append(key)
                members[key][ext] = tar.extractfile(info).read()  # type: ignore[union-attr]
    except tarfile.TarError as exc:
        raise ShardReadError(f"shard {where} is not a readable tar: {exc}") from None
    for key in order:
        parts = members[key]
        image = next((v for k, v in parts.items() if k not in ("cls", "json")), None)
        if image is None or "cls" not in parts:
            raise ShardReadError(f"shard {where}: sample {key} has no image or no .cls member")
        meta = json.loads(parts["json"]) if "json" in parts else {}
        yield np.frombuffer(image, dtype=np.uint8), int(parts["cls"]), key, meta


class S3ShardStream:
    """Batches (images, labels, keys, metas) streamed from shard objects on S3."""

    def __init__(self, settings: S3Settings, bucket: str, keys: Sequence[str], opts: S3StreamOptions | None = None):
        self.settings, self.bucket = settings, bucket
        self.opts = opts or S3StreamOptions()
        self.keys = list(keys)[self.opts.shard_id :: self.opts.num_shards]
        self._client = settings.client()
        self.epoch = 0

    def _get(self, key: str) -> bytes:
        last: Exception | None = None
        for _ in range(self.opts.retries + 1):
            try:
                return self._client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            except Exception as exc:  # botocore errors of every kind: retried, then named
                last = exc
        raise ShardReadError(
            f"GET s3://{self.bucket}/{key} at {self.settings.endpoint_url} failed after retries: {last}"
        )

    def _samples(self, order: list[str]) -> Iterator[Sample]:
        with ThreadPoolExecutor(self.opts.parallel_shards, thread_name_prefix="imgest-s3get") as pool:
            pending: list[tuple[str, Future[bytes]]] = []
            keys = iter(order)
            for key in keys:
                pending.append((key, pool.submit(self._get, key)))
                if len(pending) >= self.opts.parallel_shards:
                    break
            while pending:
                key, future = pending.pop(0)
                data = future.result()
                nxt = next(keys, None)
                if nxt is not None:
                    pending.append((nxt, pool.submit(self._get, nxt)))
                yield from tar_samples(data, f"s3://{self.bucket}/{key}")

    def _shuffled(self, samples: Iterator[Sample], rng: random.Random) -> Iterator[Sample]:
        size = self.opts.shuffle_buffer
        if size <= 1:
            yield from samples
            return
        buf: list[Sample] = []
        for s in samples:
            if len(buf) < size:
                buf.append(s)
                continue
            i = rng.randrange(size)
            yield buf[i]
            buf[i] = s
        rng.shuffle(buf)
        yield from buf

    def epoch_batches(self) -> Iterator[tuple[list[np.ndarray], np.ndarray, list[str], list[dict[str, Any]]]]:
        """One epoch: every sample of this process's shards once, shard order reshuffled with (seed, epoch)."""
        rng = random.Random(f"{self.opts.seed}-{self.epoch}")
        order = list(self.keys)
        if self.opts.shuffle_buffer > 1:
            rng.shuffle(order)
        self.epoch += 1
        batch: list[Sample] = []
        for s in self._shuffled(self._samples(order), rng):
            batch.append(s)
            if len(batch) == self.opts.batch_size:
                yield _columns(batch)
                batch = []
        if batch:
            yield _columns(batch)


def _columns(batch: list[Sample]) -> tuple[list[np.ndarray], np.ndarray, list[str], list[dict[str, Any]]]:
    return (
        [s[0] for s in batch],
        np.array([s[1] for s in batch], dtype=np.int32),
        [s[2] for s in batch],
        [s[3] for s in batch],
    )
