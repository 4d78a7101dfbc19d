"""The small public API a training script calls: a DALI external source reading images from Cassandra.

    from imgest.readback import get_cassandra_reader

    source = get_cassandra_reader("imgest.data", split_file="split-cassandra.npz", part=0, batch_size=64,
                                  shard_id=rank, num_shards=world_size, seed=epoch_seed)
    with pipe:
        jpegs, labels = fn.external_source(source=source, num_outputs=2, batch=True,
                                           dtype=[types.UINT8, types.INT32])
        images = fn.decoders.image(jpegs, device="mixed")   # the training pipeline stays in DALI

It plays the role of cassandra-dali-plugin's ``get_cassandra_reader``: ids and labels come from a split file
part (or are given), and each epoch ends with StopIteration, after which the next call starts the next epoch in
a new seeded order. Resuming mid-epoch: pass ``state=ReaderState(seed, world_size)`` (or one restored with
``load_state_dict``), call ``source.consumed()`` after each ``pipe.run()`` and save ``source.state_dict()``
(merged over ranks) with the model checkpoint; docs/readback.md shows the whole loop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from imgest.core.settings import CassandraSettings
from imgest.readback.cassandra import CassandraReader, CassandraReadOptions
from imgest.readback.cassandra_base import Batch
from imgest.readback.resumable import CassandraResume
from imgest.readback.resume import ReaderState, ResumeError


class CassandraSource:
    """A callable for ``fn.external_source(batch=True, num_outputs=2)``: (encoded images, labels) per call.

    Given a ReaderState it reads what the state leaves to its rank (``shard_id``) of the state's epoch, and
    ``consumed()`` after each ``pipe.run()`` records the oldest batch handed to DALI as delivered (DALI asks for
    batches ahead of the training step, so handing one over is not yet delivering it); the call after an epoch's
    StopIteration starts the state's next epoch.
    """

    def __init__(self, reader: CassandraReader, state: ReaderState | None = None, rank: int = 0) -> None:
        self.reader = reader
        self.state, self.rank = state, rank
        self._resume = CassandraResume(reader, state, rank) if state is not None else None
        self._epoch: Iterator[Batch] | None = None
        self._handed: deque[tuple[int, np.ndarray]] = deque()  # (epoch, offsets) handed to DALI, not consumed
        self._ended = False

    def first_order(self) -> np.ndarray | None:
        """The positions the first epoch reads (what the state leaves to this rank), or None: the reader's own
        seeded epoch. The reader requests them as soon as it connects."""
        return self._resume.assignment().unit if self._resume is not None else None

    def _next_epoch(self) -> Iterator[Batch]:
        if self._resume is None or self.state is None:
            return self.reader.epoch_batches()
        if self._ended:  # the last epoch ran out: everything handed over was trained on by now
            self.consumed(len(self._handed))
            self.state.set_epoch(self.state.epoch + 1)
            self._ended = False
        epoch = self.state.epoch

        def batches() -> Iterator[Batch]:
            for b in self._resume.batches(mark=False):  # type: ignore[union-attr]
                self._handed.append((epoch, b.offsets))
                yield b.images, b.labels, b.ids

        return batches()

    def __call__(self) -> tuple[list[np.ndarray], np.ndarray]:
        if self._epoch is None:
            self._epoch = self._next_epoch()
        try:
            images, labels, _ = next(self._epoch)
        except StopIteration:
            self._epoch, self._ended = None, True
            raise
        return images, labels

    def consumed(self, batches: int = 1) -> None:
        """The oldest BATCHES handed to DALI were trained on: record them in the reader state."""
        for _ in range(min(batches, len(self._handed))):
            epoch, offsets = self._handed.popleft()
            if self.state is not None and epoch == self.state.epoch:
                self.state.mark(self.rank, offsets.tolist())

    def state_dict(self) -> dict[str, Any]:
        """This rank's reader state as JSON types (ReaderState.merge combines the ranks' before saving)."""
        if self.state is None:
            raise ResumeError("this source was made without a reader state: pass state=ReaderState(...)")
        return self.state.state_dict()

    def __len__(self) -> int:
        """Batches per epoch for this shard."""
        return len(self.reader)

    def close(self) -> None:
        self.reader.close()


def get_cassandra_reader(
    data_table: str,
    *,
    split_file: str | Path | None = None,
    part: int = 0,
    ids: Sequence[str] | None = None,
    labels: Sequence[int] | None = None,
    settings: CassandraSettings | None = None,
    state: ReaderState | None = None,
    **options: int | bool | None,
) -> CassandraSource:
    """A Cassandra external source over DATA_TABLE ('keyspace.table') for the ids of a split file PART (or IDS with
    LABELS); OPTIONS are CassandraReadOptions fields (batch_size, prefetch_buffers, slow_start,
    max_window_mb, requests_in_flight, rows_per_request, io_threads, ooo, shard_id, num_shards, seed; the window
    sizes itself unless prefetch_buffers is given). Settings default to the IMGEST_CASSANDRA_* env. With STATE (a
    ReaderState, restored from a checkpoint or new) the source reads what it leaves to rank shard_id of num_shards
    (the state's seed and epoch decide the order), resuming mid-epoch, with another world size too."""
    if split_file is not None:
        from imgest.splits import load_split

        ids, labels = load_split(Path(split_file)).part(part)
    if ids is None or labels is None:
        raise ValueError("give split_file (and part), or ids and labels")
    reader = CassandraReader(
        settings or CassandraSettings.from_env(),
        data_table,
        [str(i) for i in ids],
        labels,
        CassandraReadOptions(**options),  # type: ignore[arg-type]
    )
    if state is not None:
        state.set_world_size(int(options.get("num_shards") or 1))
    source = CassandraSource(reader, state, int(options.get("shard_id") or 0))
    reader.open(first=source.first_order())
    return source
