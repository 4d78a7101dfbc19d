"""PyTorch without DALI: ``torch.utils.data.IterableDataset``s over stored data (``pip install imgest[torch]``).

    state = ReaderState(seed=0, world_size=world_size)          # or ReaderState.from_state_dict(saved)
    data = ShardDataset("s3://imgest/imagenet", state, rank=rank, s3=S3Settings.from_env())
    loader = DataLoader(data, batch_size=64, num_workers=2, collate_fn=collate)
    for batch in tracked(loader, state, rank):                  # batch: images, labels, ids, offsets
        ...

Ranks read disjoint parts of the epoch (the state's ``assignment``), and within a rank each DataLoader worker
(``get_worker_info``) takes every ``num_workers``-th shard (or row, or file) of it, so nothing is read twice.
Workers get a copy of the state when an iteration starts (so keep ``persistent_workers=False``, the default); the
main process records what it received (``tracked``), so the state a training script saves is exact whatever the
workers had read ahead.

Samples are ``(image, label, id, offset, sha256)``: the encoded bytes as a uint8 tensor (``decode=True``: a CHW
uint8 tensor decoded with Pillow), the int label, the id as text, the offset the state records and the sha256 the
ingest stored with the sample (shards' ``.json``; "" for Cassandra and files, whose sha256 is in the metadata).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from imgest.core.settings import CassandraSettings, S3Settings
from imgest.readback.resumable import CassandraResume, Delivered, FilesResume, ShardResume, folder_fetch, s3_fetch
from imgest.readback.resume import ReaderState, ResumeError, Units

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError as exc:  # the optional extra is missing: say how to get it
    raise ImportError("imgest.readback.torchdata needs PyTorch: pip install 'imgest[torch]'") from exc

log = logging.getLogger(__name__)
TorchSample = tuple[Any, int, str, int, str]  # image, label, id, offset, stored sha256 ("" where none)


def _worker() -> tuple[int, int]:
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def _decode(image: np.ndarray) -> Any:
    from PIL import Image

    with Image.open(io.BytesIO(image.tobytes())) as im:
        return torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1).contiguous()


class _Dataset(IterableDataset):  # type: ignore[type-arg]
    """Shared by every dataset: iterate this worker's share of the rank's remaining part, sample by sample."""

    def __init__(self, units: Units, state: ReaderState, rank: int, decode: bool) -> None:
        super().__init__()
        if not 0 <= rank < state.world_size:
            raise ResumeError(
                f"rank {rank} is outside the state's world_size {state.world_size}: after restoring a state saved "
                "with another number of ranks, call state.set_world_size(world_size)"
            )
        self.units, self.state, self.rank, self.decode = units, state, rank, decode
        state.plan(units)  # a state saved for other data fails here, and the saved state names this data

    def _batches(self, worker: int, workers: int) -> Iterator[Delivered]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[TorchSample]:
        worker, workers = _worker()
        for batch in self._batches(worker, workers):
            columns = (batch.images, batch.labels, batch.ids, batch.offsets, batch.sha256)
            for image, label, key, off, sha in zip(*columns, strict=True):
                data = _decode(image) if self.decode else torch.from_numpy(image.copy())
                yield data, int(label), key, int(off), sha or ""


class ShardDataset(_Dataset):
    """Webdataset shards of a published shard dataset in a folder or under ``s3://bucket/prefix``: the SPLIT's,
    or only SHARDS (names relative to the location, as ``ReadSet.shards``)."""

    def __init__(
        self,
        location: str,
        state: ReaderState,
        rank: int = 0,
        *,
        split: str | None = "train",
        shards: Sequence[str] | None = None,
        s3: S3Settings | None = None,
        decode: bool = False,
    ) -> None:
        from imgest.readback.resumable import shard_dead, shard_units
        from imgest.sinks.shards.store import open_store
        from imgest.sinks.shards.store_names import shard_object

        self.location, self.s3 = location, s3
        store = open_store(location, s3)
        manifest = store.read_manifest()
        if manifest is None:
            raise FileNotFoundError(f"{location} holds no published shard dataset (no manifest.json)")
        if shards is not None:  # a subset of the split's shards (ReadSet.shards of a sampled check)
            wanted = set(shards)
            manifest = {**manifest, "shards": [e for e in manifest["shards"] if shard_object(e) in wanted]}
        super().__init__(shard_units(manifest, split), state, rank, decode)
        self.dead = shard_dead(manifest, store)  # a refresh's kept shards: samples no longer live

    def _batches(self, worker: int, workers: int) -> Iterator[Delivered]:
        if self.location.startswith("s3://"):
            bucket, _, prefix = self.location[len("s3://") :].partition("/")
            fetch = s3_fetch(self.s3 or S3Settings.from_env(), bucket, prefix, dead=self.dead)
        else:
            fetch = folder_fetch(self.location, self.dead)
        return ShardResume(self.units, fetch, self.state, self.rank).batches(worker, workers, mark=False)


class CassandraDataset(_Dataset):
    """Rows of a data table ('keyspace.table') for IDS with LABELS, through imgest's CassandraReader; OPTIONS are
    CassandraReadOptions fields (the reader's own shard_id / num_shards / seed are replaced by the state's)."""

    def __init__(
        self,
        table: str,
        ids: Sequence[str] | np.ndarray,
        labels: Sequence[int] | np.ndarray,
        state: ReaderState,
        rank: int = 0,
        *,
        settings: CassandraSettings | None = None,
        decode: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(Units.of_ids(ids), state, rank, decode)
        self.table, self.ids, self.labels = table, ids, np.asarray(labels, np.int32)
        self.settings, self.options = settings, options

    def _batches(self, worker: int, workers: int) -> Iterator[Delivered]:
        from imgest.readback.cassandra import CassandraReader, CassandraReadOptions

        opts = CassandraReadOptions(**self.options)
        reader = CassandraReader(self.settings or CassandraSettings.from_env(), self.table, self.ids, self.labels, opts)
        try:
            # the reader closes after this epoch: nothing of the next one is requested ahead
            resume = CassandraResume(reader, self.state, self.rank, next_epoch=False)
            yield from resume.batches(worker, workers, mark=False)
        finally:
            reader.close()


class FilesDataset(_Dataset):
    """Files of a files dataset: absolute PATHS with their LABELS and IDS (``ReadSet.paths`` of files_set)."""

    def __init__(
        self,
        paths: Sequence[str],
        labels: Sequence[int] | np.ndarray,
        ids: Sequence[str] | np.ndarray,
        state: ReaderState,
        rank: int = 0,
        *,
        decode: bool = False,
    ) -> None:
        super().__init__(Units.of_ids(ids), state, rank, decode)
        self.paths, self.labels, self.ids = list(paths), labels, ids

    def _batches(self, worker: int, workers: int) -> Iterator[Delivered]:
        files = FilesResume(self.paths, self.labels, self.ids, self.state, self.rank, threads=4)
        return files.batches(worker, workers, mark=False)


def collate(samples: list[TorchSample]) -> dict[str, Any]:
    """A DataLoader collate_fn for samples of different sizes: images stay a list, the rest become columns."""
    return {
        "images": [s[0] for s in samples],
        "labels": torch.tensor([s[1] for s in samples], dtype=torch.int64),
        "ids": [s[2] for s in samples],
        "offsets": torch.tensor([s[3] for s in samples], dtype=torch.int64),
        "sha256": [s[4] for s in samples],
    }


def tracked(loader: Iterable[dict[str, Any]], state: ReaderState, rank: int) -> Iterator[dict[str, Any]]:
    """The batches of LOADER (collated with ``collate``), each recorded in STATE as RANK's when handed over."""
    if getattr(loader, "persistent_workers", False):
        raise ResumeError(
            "a DataLoader with persistent_workers=True keeps the reader state its workers got at the first epoch: "
            "make it with persistent_workers=False (the default)"
        )
    for batch in loader:
        state.mark(rank, batch["offsets"].tolist())
        yield batch
