"""The refresh diff's view of a baseline: its ids as sorted 64-bit keys (``index_baseline``) and its rows read back
by row number a batch at a time (``RowReader``), so that comparing a manifest with a baseline of any size holds
12 bytes a baseline row and one batch of decoded rows."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from imgest.core.errors import ImgestError
from imgest.core.idhash import id_hashes

KEY_SEEDS = (0, 1, 2, 3)  # id key seeds tried in turn while two different ids of the baseline share a key
READ_ROWS = 16_384  # rows of a manifest or baseline decoded, compared and written at a time


def _no_rows(dtype: type = np.uint8) -> np.ndarray:
    return np.zeros(0, dtype)


class BaselineError(ImgestError):
    """The baseline of the last version cannot be compared with (its ids cannot be told apart)."""


@dataclass
class KeyIndex:
    """The baseline's ids as sorted 64-bit keys: ``rows[i]`` is the baseline row of ``keys[i]``. ``aliases`` are
    the later rows of an id the baseline holds twice, ``alias_of`` the first row of each (they share its fate)."""

    keys: np.ndarray
    rows: np.ndarray
    seed: int
    size: int
    aliases: np.ndarray = field(default_factory=lambda: _no_rows(np.int64))
    alias_of: np.ndarray = field(default_factory=lambda: _no_rows(np.int64))

    def find(self, ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """The baseline row of each of IDS whose key it holds (-1 where none): compare the ids before trusting it."""
        keys = id_hashes(ids, self.seed)
        if not len(self.keys):
            return np.full(len(keys), -1, np.int64)
        slot = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        return np.where(self.keys[slot] == keys, self.rows[slot].astype(np.int64), -1)


def index_baseline(baseline: pq.ParquetFile | None, path: Path | None) -> KeyIndex:
    """The key index of BASELINE's ids (the file PATH; empty when there is none), with a seed under which no two
    different ids share a key."""
    if baseline is None:
        return KeyIndex(_no_rows(np.uint64), _no_rows(np.uint32), KEY_SEEDS[0], 0)
    size = baseline.metadata.num_rows
    for seed in KEY_SEEDS:
        keys = np.empty(size, np.uint64)
        start = 0
        for batch in baseline.iter_batches(batch_size=READ_ROWS, columns=["id"]):
            keys[start : start + batch.num_rows] = id_hashes(batch.column(0), seed)
            start += batch.num_rows
        order = np.argsort(keys, kind="stable")  # equal keys keep the baseline's order: the first row first
        keys.sort()  # in place: the same as keys[order], without a third array a row
        rows = order.astype(np.uint32) if size < 2**32 else order
        del order
        later = np.flatnonzero(keys[1:] == keys[:-1]) + 1
        if not len(later):
            return KeyIndex(keys, rows, seed, size)
        head = np.maximum.accumulate(np.where(np.r_[True, keys[1:] != keys[:-1]], np.arange(size), 0))[later]
        aliases, alias_of = rows[later].astype(np.int64), rows[head].astype(np.int64)
        twice = RowReader(baseline, ["id"]).take(aliases).column("id")
        if twice.equals(RowReader(baseline, ["id"]).take(alias_of).column("id")):  # the same id twice, not a collision
            keep = np.ones(size, bool)
            keep[later] = False
            return KeyIndex(keys[keep], rows[keep], seed, size, aliases, alias_of)
    raise BaselineError(
        f"{path}: different ids share a 64-bit key under every seed {KEY_SEEDS}: delete the folder holding it "
        f"({path.parent if path else 'refresh/<target>'}: baseline, plan and state) so that the next refresh "
        "makes a new first version of every image, or report this (it should never happen)"
    )


class RowReader:
    """The COLUMNS of SOURCE's rows by row number, a batch of READ_ROWS rows decoded at a time. A read continues
    where the last one stopped when its rows come later in the row group (rows asked for in the file's order cost
    one pass, however large the row groups); an earlier row starts its row group again."""

    def __init__(self, source: pq.ParquetFile, columns: list[str]) -> None:
        self.source, self.columns = source, columns
        meta = source.metadata
        self.starts = np.cumsum([0] + [meta.row_group(g).num_rows for g in range(meta.num_row_groups)])
        self.empty = pa.table({c: pa.array([], source.schema_arrow.field(c).type) for c in columns})
        self._group = -1
        self._batches: Iterator[pa.RecordBatch] = iter(())
        self._batch: pa.RecordBatch | None = None
        self._offset = 0  # the row number of the batch's first row

    def _seek(self, row: int) -> pa.RecordBatch:
        """The batch holding ROW (self._offset is its first row's number)."""
        group = int(np.searchsorted(self.starts, row, side="right")) - 1
        if group != self._group or row < self._offset:
            self._group, self._offset, self._batch = group, int(self.starts[group]), None
            self._batches = self.source.iter_batches(batch_size=READ_ROWS, row_groups=[group], columns=self.columns)
        while self._batch is None or row >= self._offset + self._batch.num_rows:
            if self._batch is not None:
                self._offset += self._batch.num_rows
            self._batch = next(self._batches)
        return self._batch

    def take(self, at: np.ndarray) -> pa.Table:
        """The rows AT (row numbers; -1: a null row), in AT's order."""
        valid = np.flatnonzero(at >= 0)
        order = valid[np.argsort(at[valid], kind="stable")]
        wanted = at[order]
        pieces, lo = [self.empty], 0
        while lo < len(wanted):
            batch = self._seek(int(wanted[lo]))
            hi = int(np.searchsorted(wanted, self._offset + batch.num_rows))
            pieces.append(pa.Table.from_batches([batch.take(pa.array(wanted[lo:hi] - self._offset))]))
            lo = hi
        found = pa.concat_tables(pieces).combine_chunks()
        index = np.full(len(at), -1, np.int64)
        index[order] = np.arange(len(order))
        return found.take(pa.array(index, mask=index < 0))
