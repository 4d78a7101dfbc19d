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
a new seeded order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from imgest.core.settings import CassandraSettings
from imgest.readback.cassandra import Batch, CassandraReader, CassandraReadOptions


class CassandraSource:
    """A callable for ``fn.external_source(batch=True, num_outputs=2)``: (encoded images, labels) per call."""

    def __init__(self, reader: CassandraReader) -> None:
        self.reader = reader
        self._epoch: Iterator[Batch] | None = None

    def __call__(self) -> tuple[list[np.ndarray], np.ndarray]:
        if self._epoch is None:
            self._epoch = self.reader.epoch_batches()
        try:
            images, labels, _ = next(self._epoch)
        except StopIteration:
            self._epoch = None
            raise
        return images, labels

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
    **options: int | None,
) -> CassandraSource:
    """A Cassandra external source over DATA_TABLE ('keyspace.table') for the ids of a split file PART (or IDS with
    LABELS); OPTIONS are CassandraReadOptions fields (batch_size, prefetch_batches, requests_in_flight,
    rows_per_request, connections, shard_id, num_shards, seed). Settings default to the IMGEST_CASSANDRA_* env."""
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
    reader.open()
    return CassandraSource(reader)
