"""The manifest's row ranges that Spark tasks read themselves (imgest.spark.manifest_rdd), without Spark."""

from __future__ import annotations

from pathlib import Path

import pytest

from imgest.core.staging import Staged
from imgest.sources import manifest as manifest_mod
from imgest.sources.manifest import Candidate, iter_manifest, write_manifest
from imgest.spark import manifest_rdd
from imgest.spark.manifest_rdd import default_partitions, in_order, manifest_rows, range_bytes, read_rows, row_ranges


def candidates(n: int, tar: bool = False) -> list[Candidate]:
    out = []
    for i in range(n):
        container = f"train/n{i // 10:03d}.tar" if tar else ""
        rel = f"train/n{i // 10:03d}/img_{i:05d}.JPEG"
        out.append(Candidate(f"id-{i}", "train", rel, f"n{i // 10:03d}", i // 10, 100 + i, 1.0, container, i * 512))
    return out


@pytest.fixture
def small_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manifest_mod, "BATCH_ROWS", 7)  # many row groups: ranges cross their boundaries


@pytest.mark.parametrize("tar", [False, True])
def test_ranges_read_every_row_once_in_order(tmp_path: Path, small_groups: None, tar: bool) -> None:
    rows = candidates(103, tar)
    path = tmp_path / "manifest.parquet"
    write_manifest(rows, path)
    assert manifest_rows(path) == 103
    assert in_order(path)
    for parts in (1, 4, 15, 103, 500):
        ranges = row_ranges(103, parts)
        assert len(ranges) == min(parts, 103)
        assert max(b - a for a, b in ranges) - min(b - a for a, b in ranges) <= 1
        read = [c for start, stop in ranges for c in read_rows(Staged(str(path)), start, stop)]
        assert read == rows, f"{parts} partitions"


def test_each_ranges_source_bytes(tmp_path: Path, small_groups: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """range_bytes sums the size column over each partition's rows, its batches crossing the ranges' bounds."""
    monkeypatch.setattr(manifest_rdd, "BATCH_ROWS", 5)
    rows = candidates(103)
    path = tmp_path / "manifest.parquet"
    write_manifest(rows, path)
    for parts in (1, 4, 15, 103):
        ranges = row_ranges(103, parts)
        assert range_bytes(path, ranges) == [sum(c.size for c in rows[a:b]) for a, b in ranges], f"{parts} partitions"
    empty = tmp_path / "empty.parquet"
    write_manifest([], empty)
    assert range_bytes(empty, row_ranges(0, 4)) == [0]


def test_a_manifest_out_of_order_is_detected(tmp_path: Path, small_groups: None) -> None:
    rows = candidates(40)
    rows[20], rows[30] = rows[30], rows[20]  # across row groups
    path = tmp_path / "manifest.parquet"
    write_manifest(rows, path)
    assert not in_order(path)
    assert list(iter_manifest(path)) == rows


def test_an_empty_manifest_is_one_empty_range(tmp_path: Path) -> None:
    path = tmp_path / "manifest.parquet"
    write_manifest([], path)
    assert manifest_rows(path) == 0
    assert in_order(path)
    assert row_ranges(0, 8) == [(0, 0)]
    assert list(read_rows(Staged(str(path)), 0, 0)) == []


def test_default_partitions() -> None:
    assert default_partitions(100, 2) == 4
    assert default_partitions(1_331_167, 2) == 1332
