"""Streaming webdataset shards from S3: whole-shard GETs in parallel, tars parsed in memory, a shuffle buffer.

The read path the S3-shard prior art describes: a pool of threads each GETs a whole shard object (one request,
no per-sample round trips), the tar is parsed from memory, and samples pass through a seeded shuffle buffer of
``shuffle_buffer`` samples that spans several shards. ``shard_id`` / ``num_shards`` split the shard list between
training processes. ``dead`` names, per object key, the samples a refresh took out of a kept shard (its manifest
entry's ``dead`` keys): they are skipped.

How many shards are fetched ahead sizes itself by default (``imgest.readback.window``): shards delivered per
second x the shortest GET x 3, grown from ``slow_start`` shards and capped by ``max_buffer_mb`` of shard bytes and
by ``io_threads`` GETs; a GET's time includes its transfer, so on a fast link the slow start's few shards are
ahead and 100 ms away enough to cover the round trip. ``parallel_shards`` fixes the count instead.
"""

from __future__ import annotations

import io
import json
import logging
import random
import tarfile
import threading
from collections import deque
from collections.abc import Collection, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from imgest.core.errors import ImgestError
from imgest.core.settings import S3Settings
from imgest.readback.window import AdaptiveWindow, WindowStats

log = logging.getLogger(__name__)
Sample = tuple[np.ndarray, int, str, dict[str, Any]]  # image bytes, label, key, json member


class ShardReadError(ImgestError):
    """A shard could not be fetched or parsed."""


@dataclass(frozen=True)
class S3StreamOptions:
    """Knobs of the streaming shard reader; the defaults size the read-ahead by themselves."""

    batch_size: int = 64
    parallel_shards: int | None = None  # None: adaptive read-ahead; N: exactly N whole-shard GETs ahead
    slow_start: int = 4  # shards in the first (and smallest) adaptive window
    io_threads: int = 16  # cap on GETs in flight (threads and HTTP connections)
    max_buffer_mb: int = 512  # memory bound of the adaptive window (shards fetched or fetching, not consumed)
    shuffle_buffer: int = 0  # samples; 0 keeps shard order
    seed: int = 0
    shard_id: int = 0
    num_shards: int = 1
    retries: int = 3


def _tar_members(data: bytes, where: str) -> Iterator[tuple[str, memoryview]]:
    """(name, bytes) of each regular file of an in-memory ustar archive, without copying the payloads.

    Our shards are written by imgest's deterministic tar writer: plain ustar headers, names without long-name
    extensions. Anything else (a pax or GNU long-name header) falls back to the tarfile module.
    """
    view, off, end = memoryview(data), 0, len(data)
    while off + 512 <= end:
        header = data[off : off + 512]
        if header.count(0) == 512:  # end-of-archive blocks
            return
        kind = header[156:157]
        if kind not in (b"0", b"\0"):
            if kind in (b"x", b"g", b"L", b"K"):
                raise tarfile.ReadError(f"extended header in {where}")
            size = int(header[124:136].strip(b"\0 ") or b"0", 8)
            off += 512 + -(-size // 512) * 512
            continue
        name = header[0:100].split(b"\0", 1)[0].decode()
        prefix = header[345:500].split(b"\0", 1)[0].decode()
        size = int(header[124:136].strip(b"\0 ") or b"0", 8)
        if off + 512 + size > end:
            raise tarfile.ReadError(f"truncated member {name} in {where}")
        yield (f"{prefix}/{name}" if prefix else name), view[off + 512 : off + 512 + size]
        off += 512 + -(-size // 512) * 512


def _members(data: bytes, where: str) -> Iterator[tuple[str, bytes | memoryview]]:
    try:
        yield from _tar_members(data, where)
        return
    except (tarfile.ReadError, ValueError, UnicodeDecodeError):
        pass
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for info in tar:
                if info.isfile():
                    yield info.name, tar.extractfile(info).read()  # type: ignore[union-attr]
    except tarfile.TarError as exc:
        raise ShardReadError(f"shard {where} is not a readable tar: {exc}") from None


def tar_samples(data: bytes, where: str) -> Iterator[Sample]:
    """Samples (image, label, key, meta) of an in-memory webdataset tar, grouped by key in archive order."""
    key: str | None = None
    parts: dict[str, bytes | memoryview] = {}
    for name, payload in _members(data, where):
        k, _, ext = name.partition(".")
        if k != key and key is not None:
            yield _sample(key, parts, where)
            parts = {}
        key = k
        parts[ext] = payload
    if key is not None:
        yield _sample(key, parts, where)


def live_samples(samples: Iterator[Sample], dead: Collection[str] | None) -> Iterator[Sample]:
    """SAMPLES without those whose key is in DEAD (a kept shard's dead samples; None or empty: every sample)."""
    if not dead:
        return samples
    return (s for s in samples if s[2] not in dead)


def _sample(key: str, parts: dict[str, bytes | memoryview], where: str) -> Sample:
    image = next((v for k, v in parts.items() if k not in ("cls", "json")), None)
    if image is None or "cls" not in parts:
        raise ShardReadError(f"shard {where}: sample {key} has no image or no .cls member")
    meta = json.loads(bytes(parts["json"])) if "json" in parts else {}
    return np.frombuffer(image, dtype=np.uint8), int(bytes(parts["cls"])), key, meta


class S3ShardStream:
    """Batches (images, labels, keys, metas) streamed from shard objects on S3."""

    def __init__(
        self,
        settings: S3Settings,
        bucket: str,
        keys: Sequence[str],
        opts: S3StreamOptions | None = None,
        dead: Mapping[str, Collection[str]] | None = None,
    ):
        self.settings, self.bucket = settings, bucket
        self.dead = {k: frozenset(v) for k, v in (dead or {}).items() if v}  # object key -> dead sample keys
        self.opts = opts or S3StreamOptions()
        self.keys = list(keys)[self.opts.shard_id :: self.opts.num_shards]
        self._client = settings.client(max_pool_connections=max(10, self.threads))
        self.epoch = 0
        self.window_stats: WindowStats | None = None  # the read-ahead window of the last epoch read

    @property
    def threads(self) -> int:
        """GET threads: the fixed count, or the cap of the adaptive window."""
        return max(1, self.opts.parallel_shards or self.opts.io_threads)

    def window(self) -> AdaptiveWindow:
        """The read-ahead window in shards these options give (adaptive unless parallel_shards is set)."""
        fixed = self.opts.parallel_shards is not None
        initial = max(1, min(self.opts.parallel_shards or self.opts.slow_start, self.threads))
        start = self.window_stats.final if self.window_stats else None  # the last epoch's window
        return AdaptiveWindow("shards", initial, self.threads, adaptive=not fixed, start=start)

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
        window, lock = self.window(), threading.Lock()
        pending: deque[tuple[str, Future[bytes]]] = deque()
        keys = iter(order)
        sizes: list[int] = []

        def pump() -> None:  # with LOCK held: GET the next shards while the window allows
            while len(pending) < max(1, round(window.size)):
                key = next(keys, None)
                if key is None:
                    return
                pending.append((key, pool.submit(fetch, key, window.stamp())))

        def fetch(key: str, token: tuple[float, float]) -> bytes:
            data = self._get(key)
            with lock:  # accounted before the consumer can see the shard
                sizes.append(len(data))
                window.landed(token, 1)
                if window.adaptive:  # memory bound, in shards of the average size seen
                    window.set_cap(min(self.threads, self.opts.max_buffer_mb * 2**20 / (sum(sizes) / len(sizes))))
                pump()
            return data

        with ThreadPoolExecutor(self.threads, thread_name_prefix="imgest-s3get") as pool:
            try:
                with lock:
                    pump()
                while pending:
                    key, future = pending[0]
                    data = future.result()
                    with lock:
                        pending.popleft()
                        pump()
                    yield from live_samples(tar_samples(data, f"s3://{self.bucket}/{key}"), self.dead.get(key))
            finally:
                with lock:
                    keys = iter(())  # nothing more once the consumer stops
                    for _, future in pending:
                        future.cancel()
                self.window_stats = window.finish()
                log.debug("s3 read-ahead window of epoch %s: %s", self.epoch - 1, self.window_stats)

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
