"""The split builder in bounded memory: ids sorted by byte buckets from a streamed samples.parquet, and the
split's grouping by class as a chunked counting sort (the same results as sorting everything at once)."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imgest.sinks.shards.store import LocalStore
from imgest.splits import sources
from imgest.splits import split as split_module
from imgest.splits.sources import from_shards, sorted_columns, uuid_bytes
from imgest.splits.split import cut, id_strings, make_split


def _samples(path: Path, n: int, seed: int = 0, row_group: int = 1000) -> pa.Table:
    """A samples.parquet of N random UUIDs (some upper-case), labels in 0..9 and two splits."""
    rng = np.random.default_rng(seed)
    ids = id_strings(np.frombuffer(rng.bytes(16 * n), dtype="S16")).astype(str)
    ids[::7] = np.char.upper(ids[::7])
    table = pa.table(
        {
            "id": pa.array(ids, pa.string()),
            "label": pa.array(rng.integers(0, 10, n), pa.int32()),
            "split": pa.array(np.where(rng.random(n) < 0.8, "train", "val"), pa.string()),
            "shard": pa.array(["train-000000.tar"] * n, pa.string()),
            "position": pa.array(np.arange(n), pa.int32()),
        }
    )
    pq.write_table(table, path, row_group_size=row_group)
    return table


def _naive(table: pa.Table, only_split: str | None) -> tuple[np.ndarray, np.ndarray]:
    """What from_shards did before: every id at once, one argsort."""
    if only_split is not None:
        table = table.filter(pa.compute.equal(table.column("split"), only_split))
    ids, labels = uuid_bytes(table.column("id")), table.column("label").to_numpy().astype(np.int32)
    order = np.argsort(ids, kind="stable")
    return ids[order], labels[order]


@pytest.mark.parametrize("only_split", [None, "train", "none-such"])
def test_sorted_columns_match_one_sort_of_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, only_split: str | None
) -> None:
    monkeypatch.setattr(sources, "SAMPLE_BATCH_ROWS", 37)  # many batches, runs of a byte bucket across them
    table = _samples(tmp_path / "s.parquet", 5000, row_group=333)
    ids, labels = sorted_columns(pq.ParquetFile(tmp_path / "s.parquet"), only_split)
    want_ids, want_labels = _naive(table, only_split)
    assert ids.dtype == np.dtype("S16")
    assert labels.dtype == np.int32
    assert np.array_equal(ids, want_ids)
    assert np.array_equal(labels, want_labels)


def test_from_shards_reads_a_published_dataset_in_bounded_numpy_memory(tmp_path: Path) -> None:
    n = 200_000
    table = _samples(tmp_path / "samples.parquet", n, seed=3, row_group=65_536)
    (tmp_path / "manifest.json").write_text(json.dumps({"classes": [f"c{i}" for i in range(10)], "key": "k"}))
    tracemalloc.start()
    try:
        rows = from_shards(LocalStore(tmp_path), only_split="train")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    want_ids, want_labels = _naive(table, "train")
    assert np.array_equal(rows.ids, want_ids)
    assert np.array_equal(rows.labels, want_labels)
    assert rows.num_classes == 10
    assert rows.source["kind"] == "shards"
    # the two outputs (20 bytes a row) and one batch; sorting everything at once needed about twice that
    assert peak < 20 * len(want_ids) + 3 * 2**20, peak


def _reference_split(labels: np.ndarray, ratios: list[int], seed: int, classes: int) -> list[np.ndarray]:
    parts: list[list[np.ndarray]] = [[] for _ in ratios]
    for c in range(classes):
        rows = np.flatnonzero(labels == c)
        shuffled = np.random.default_rng([seed, c]).permutation(rows)
        start = 0
        for p, size in enumerate(cut(len(rows), ratios)):
            parts[p].append(shuffled[start : start + size])
            start += size
    return [np.sort(np.concatenate(p)) if p else np.zeros(0, dtype=np.int64) for p in parts]


@given(labels=st.lists(st.integers(-1, 8), min_size=0, max_size=400), seed=st.integers(0, 5))
@settings(max_examples=150, deadline=None)
def test_chunked_grouping_by_class_splits_as_before(labels: list[int], seed: int) -> None:
    arr = np.asarray(labels, dtype=np.int32)
    old_chunk = split_module.ROW_CHUNK
    split_module.ROW_CHUNK = 13  # rows cross many chunks (hypothesis forbids function-scoped fixtures)
    try:
        parts = make_split(arr, [3, 1, 2], "original", seed, 7)
    finally:
        split_module.ROW_CHUNK = old_chunk
    for got, expect in zip(parts, _reference_split(arr, [3, 1, 2], seed, 7), strict=True):
        assert got.dtype == np.int64
        assert np.array_equal(got, expect)


def test_make_split_memory_stays_a_few_bytes_a_row() -> None:
    labels = np.random.default_rng(0).integers(0, 1000, 1_000_000).astype(np.int32)
    tracemalloc.start()
    try:
        parts = make_split(labels, [8, 2], "original", 0, 1000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sum(len(p) for p in parts) == len(labels)
    # parts (8 bytes a row) + rows by class (int32) + part of each row (int8) + chunks; one argsort of all rows
    # (int64) and its copies took more than 30
    assert peak < 14 * len(labels) + 4 * 2**20, peak
