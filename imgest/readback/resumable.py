"""Every reader of the project over what a ReaderState leaves to one rank: Cassandra, shards (folder, S3), files.

Each ``*Resume`` reads its rank's remaining part of the epoch (``ReaderState.assignment``) with the project's own
reader underneath (``CassandraReader`` given an explicit order, ``S3ShardStream`` given the shard list, files
read as they are) and yields ``Delivered`` batches: images (encoded bytes), labels, ids, the offsets the state
records, and the sha256 stored with each sample where the format carries it (shards' ``.json``).

``batches(mark=True)`` records a batch in the state when it is handed over; a DataLoader worker passes
``mark=False`` and the main process marks what it received (``imgest.readback.torchdata.tracked``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from imgest.core.errors import ImgestError
from imgest.core.sampling import IdIndex
from imgest.readback.cassandra_base import ReadError
from imgest.readback.resume import Assignment, ReaderState, Units
from imgest.readback.s3shards import Sample, ShardReadError, live_samples, tar_samples

log = logging.getLogger(__name__)
ShardFetch = Callable[[list[tuple[str, int]]], Iterator[list[Sample]]]  # (name, samples) -> each shard's samples


class FileReadError(ImgestError):
    """A file of a files dataset could not be read."""


@dataclass
class Delivered:
    """One batch handed over: encoded images, labels, ids, offsets in the rank's part, stored sha256 (or None)."""

    images: list[np.ndarray]
    labels: np.ndarray
    ids: list[str]
    offsets: np.ndarray
    sha256: list[str | None]

    def __len__(self) -> int:
        return len(self.ids)


def _id_column(ids: Sequence[str] | np.ndarray) -> np.ndarray:
    if isinstance(ids, np.ndarray) and ids.dtype.kind == "S":
        return ids
    return np.array([i if isinstance(i, bytes) else str(i).encode() for i in ids], dtype="S")


class _Resume:
    """What every resumable reader shares: its units, the state, the rank and the batch size."""

    def __init__(self, units: Units, state: ReaderState, rank: int, batch_size: int) -> None:
        self.units, self.state, self.rank, self.batch_size = units, state, rank, batch_size

    def assignment(self, worker: int = 0, workers: int = 1) -> Assignment:
        return self.state.assignment(self.units, self.rank, worker, workers)

    def _hand(self, batch: Delivered, mark: bool) -> Delivered:
        if mark:
            self.state.mark(self.rank, batch.offsets.tolist())
        return batch


class CassandraResume(_Resume):
    """imgest's CassandraReader (its window, out-of-order delivery) over the rank's remaining rows; with
    NEXT_EPOCH (and the reader's prefetch_next_epoch) the rank's part of the next epoch is requested while this
    one drains, for a reader that goes on reading it (not one closed after the epoch)."""

    def __init__(self, reader: Any, state: ReaderState, rank: int, next_epoch: bool = True) -> None:
        super().__init__(Units.of_ids(reader.ids), state, rank, reader.opts.batch_size)
        self.reader, self.next_epoch = reader, next_epoch
        self._index = IdIndex(_id_column(reader.ids))

    def batches(self, worker: int = 0, workers: int = 1, mark: bool = True) -> Iterator[Delivered]:
        """The rows left to this rank (WORKER's share of them), in batches as they land."""
        a = self.assignment(worker, workers)
        offset_of = np.full(len(self.units.sizes), -1, np.int64)
        offset_of[a.unit] = a.offset
        for images, labels, ids in self.reader.epoch_batches(order=a.unit, next_order=self._next(worker, workers)):
            rows = np.array([self._index.find(i) for i in ids], np.int64)
            offsets = offset_of[rows]
            if (rows < 0).any() or (offsets < 0).any():
                raise ReadError(f"{self.reader.table} returned rows this rank did not ask for: {ids[:3]}...")
            yield self._hand(Delivered(images, labels, ids, offsets, [None] * len(ids)), mark)

    def _next(self, worker: int, workers: int) -> np.ndarray | None:
        """What this rank (WORKER's share) reads of the next epoch when nothing of it is delivered yet: the reader
        requests it while this epoch drains, and uses it if the next batches() asks for exactly that."""
        if not (self.next_epoch and getattr(self.reader.opts, "prefetch_next_epoch", False)):
            return None
        state = self.state
        following = ReaderState(state.seed, state.world_size, state.epoch + 1)
        following.fingerprint, following.samples = state.fingerprint, state.samples
        return following.assignment(self.units, self.rank, worker, workers).unit


def folder_fetch(root: str | Path, dead: Mapping[str, Collection[str]] | None = None) -> ShardFetch:
    """Shards read whole from a folder, one after another, without the DEAD samples of each (``shard_dead``)."""
    dead = dead or {}

    def fetch(shards: list[tuple[str, int]]) -> Iterator[list[Sample]]:
        for name, _ in shards:
            path = Path(root) / name
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise ShardReadError(f"cannot read shard {path}: {exc}") from None
            yield list(live_samples(tar_samples(data, str(path)), dead.get(name)))

    return fetch


def s3_fetch(
    settings: Any, bucket: str, prefix: str, options: Any = None, dead: Mapping[str, Collection[str]] | None = None
) -> ShardFetch:
    """Shards through imgest's S3ShardStream (its GETs ahead, in parallel), given the shard list in order, without
    the DEAD samples of each (``shard_dead``)."""
    from imgest.readback.s3shards import S3ShardStream, S3StreamOptions

    base = replace(options or S3StreamOptions(), shuffle_buffer=0, shard_id=0, num_shards=1)

    def fetch(shards: list[tuple[str, int]]) -> Iterator[list[Sample]]:
        keys = [_s3_key(prefix, name) for name, _ in shards]
        stream = S3ShardStream(settings, bucket, keys, base, {_s3_key(prefix, n): d for n, d in (dead or {}).items()})
        flat = (s for columns in stream.epoch_batches() for s in zip(*columns, strict=True))
        for key, (_, size) in zip(keys, shards, strict=True):
            got = [s for _, s in zip(range(size), flat, strict=False)]
            if len(got) != size:
                raise ShardReadError(f"s3://{bucket}/{key} holds fewer samples than its manifest's {size}")
            yield got
        if next(flat, None) is not None:
            raise ShardReadError(f"shards under s3://{bucket}/{prefix} hold more samples than their manifest says")

    return fetch


def _s3_key(prefix: str, name: str) -> str:
    return f"{prefix.strip('/')}/{name}" if prefix.strip("/") else name


def shard_dead(manifest: dict[str, Any], store: Any) -> dict[str, frozenset[str]]:
    """shard object -> keys of its dead samples, for the shards of a published manifest (of STORE) that a refresh
    kept with some samples taken out (their ``samples`` counts only the live ones); read from its shards table."""
    from imgest.sinks.shards.shard_table import dead_keys
    from imgest.sinks.shards.store_names import shard_object

    dead = dead_keys(store, manifest, {e["name"] for e in manifest["shards"]})
    return {shard_object(e): dead[e["name"]] for e in manifest["shards"] if e["name"] in dead}


def shard_units(manifest: dict[str, Any], split: str | None = "train") -> Units:
    """The shards of SPLIT in a published manifest, with their sample counts."""
    from imgest.sinks.shards.store_names import shard_object

    entries = [e for e in manifest["shards"] if split is None or e["split"] == split]
    return Units.of_shards([shard_object(e) for e in entries], [int(e["samples"]) for e in entries])


class ShardResume(_Resume):
    """Webdataset shards (folder or S3) over the rank's remaining samples: whole shards fetched, the samples
    already delivered of a shard another rank began are skipped."""

    def __init__(self, units: Units, fetch: ShardFetch, state: ReaderState, rank: int, batch_size: int = 64) -> None:
        super().__init__(units, state, rank, batch_size)
        self.fetch = fetch

    def samples(self, worker: int = 0, workers: int = 1) -> Iterator[tuple[Sample, int]]:
        """(sample, offset) for every sample left to this rank (WORKER's share), in reading order."""
        runs = self.assignment(worker, workers).runs()
        shards = [(str(self.units.names[u]), int(self.units.sizes[u])) for u, _, _ in runs]
        for (u, wanted, offsets), samples in zip(runs, self.fetch(shards), strict=True):
            if len(samples) != self.units.sizes[u]:
                raise ShardReadError(
                    f"shard {self.units.names[u]} holds {len(samples)} samples, its manifest says "
                    f"{self.units.sizes[u]}: re-publish the shard dataset"
                )
            for w, off in zip(wanted.tolist(), offsets.tolist(), strict=True):
                yield samples[w], off

    def batches(self, worker: int = 0, workers: int = 1, mark: bool = True) -> Iterator[Delivered]:
        """The samples left to this rank, in batches."""
        batch: list[tuple[Sample, int]] = []
        for item in self.samples(worker, workers):
            batch.append(item)
            if len(batch) == self.batch_size:
                yield self._hand(_shard_batch(batch), mark)
                batch = []
        if batch:
            yield self._hand(_shard_batch(batch), mark)


def _shard_batch(batch: list[tuple[Sample, int]]) -> Delivered:
    return Delivered(
        [s[0] for s, _ in batch],
        np.array([s[1] for s, _ in batch], np.int32),
        [str(s[3].get("id", s[2])) for s, _ in batch],
        np.array([o for _, o in batch], np.int64),
        [s[3].get("sha256") for s, _ in batch],
    )


class FilesResume(_Resume):
    """A files dataset (absolute PATHS in ids order) over the rank's remaining files, read with THREADS."""

    def __init__(
        self,
        paths: Sequence[str],
        labels: Sequence[int] | np.ndarray,
        ids: Sequence[str] | np.ndarray,
        state: ReaderState,
        rank: int,
        batch_size: int = 64,
        threads: int = 8,
    ) -> None:
        super().__init__(Units.of_ids(ids), state, rank, batch_size)
        self.paths, self.labels, self.ids, self.threads = list(paths), np.asarray(labels, np.int32), ids, threads

    def _read(self, i: int) -> np.ndarray:
        try:
            return np.frombuffer(Path(self.paths[i]).read_bytes(), np.uint8)
        except OSError as exc:
            raise FileReadError(f"cannot read file {self.paths[i]}: {exc}") from None

    def batches(self, worker: int = 0, workers: int = 1, mark: bool = True) -> Iterator[Delivered]:
        """The files left to this rank, in batches (read in parallel within a batch)."""
        a = self.assignment(worker, workers)
        with ThreadPoolExecutor(self.threads, thread_name_prefix="imgest-files") as pool:
            for start in range(0, len(a), self.batch_size):
                units = a.unit[start : start + self.batch_size].tolist()
                images = list(pool.map(self._read, units))
                ids = [self.ids[i].decode() if isinstance(self.ids[i], bytes) else str(self.ids[i]) for i in units]
                batch = Delivered(
                    images, self.labels[units], ids, a.offset[start : start + self.batch_size], [None] * len(ids)
                )
                yield self._hand(batch, mark)
