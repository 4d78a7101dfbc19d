"""The read-back check's Cassandra sample from a share of the ring (imgest.readback.cassandra_sample): the quotas of
the recorded class counts, each class's quota of the smallest seeded keys among the rows read, more of the ring
read while a class is short, the whole ring (the full scan's choice) where the first share would be all of it.

The token sub-ranges are a stand-in here (each row in a sub-range of its own, uniformly or not): what is tested is
the choice (the real scan of a real Cassandra: tests/readback/test_sample_step.py)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from imgest.core.sampling import BalancedSample, ClassCounts, Columns, row_keys
from imgest.readback import cassandra_sample
from imgest.readback.cassandra_sample import RANGES, first_share, sampled_rows


def _table(per_class: Sequence[int], where: np.ndarray | None = None) -> Columns:
    labels = np.repeat(np.arange(len(per_class), dtype=np.int32), per_class)
    n = len(labels)
    rng = np.random.default_rng(5)
    return {
        "id": np.array([f"{i:08x}-row" for i in rng.permutation(10 * n)[:n]], "S"),
        "label": labels,
        "sha256": np.zeros((n, 32), np.uint8),
        "recorded": np.ones(n, bool),
        "nbytes": np.full(n, 100, np.int64),
        "_range": rng.integers(0, RANGES, n) if where is None else where,
    }


def _known(table: Columns) -> ClassCounts:
    known = ClassCounts()
    known.add(table["label"])
    return known


def _scan(monkeypatch: pytest.MonkeyPatch, table: Columns, picks: list[list[int]]) -> None:
    def chunks(session: Any, meta: str, dataset: str, members: list[str], split: Any, pick: Any = None) -> Iterator:
        picks.append(list(pick))
        keep = np.isin(table["_range"], pick)
        yield {k: v[keep] for k, v in table.items() if k != "_range"}

    monkeypatch.setattr(cassandra_sample, "metadata_chunks", chunks)


def _empty() -> Columns:
    return {
        "id": np.zeros(0, "S1"),
        "label": np.zeros(0, np.int32),
        "sha256": np.zeros((0, 32), np.uint8),
        "recorded": np.zeros(0, bool),
        "nbytes": np.zeros(0, np.int64),
    }


def _sample(table: Columns, size: int, seed: int = 0) -> tuple[Columns, Any]:
    return sampled_rows(None, "ks.m", "d", ["v"], "train", size, seed, _known(table), _empty())


def test_a_share_of_the_ring_gives_each_class_its_quota_of_the_smallest_keys_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table, picks = _table([200] * 50), []
    _scan(monkeypatch, table, picks)
    cols, report = _sample(table, 500)
    assert len(picks) == 1  # the first share held every quota
    share = len(picks[0]) / RANGES
    assert report.scanned == pytest.approx(share)
    assert share == pytest.approx(first_share(_known(table), np.full(50, 10)), abs=1 / RANGES)
    assert share < 0.2  # (10 + 3 x sqrt(10) + 3) / 200 of the ring, not all of it
    assert report.total == 10_000
    assert report.checked == 500
    assert set(report.balance["per_class"].values()) == {10}
    read = np.isin(table["_range"], picks[0])
    keys = row_keys(table["id"], 0)
    for label in range(50):  # per class: its 10 smallest keys among the rows read
        mine = read & (table["label"] == label)
        expected = set(table["id"][mine][np.argsort(keys[mine])[:10]])
        assert set(cols["id"][cols["label"] == label]) == expected
    again, _ = _sample(table, 500)
    assert np.array_equal(again["id"], cols["id"])  # seeded: the same choice
    other, _ = _sample(table, 500, seed=1)
    assert not np.array_equal(other["id"], cols["id"])


def test_a_class_short_in_the_share_read_makes_it_read_more(monkeypatch: pytest.MonkeyPatch) -> None:
    table = _table([200] * 50)
    order = np.random.default_rng([0, 7]).permutation(RANGES)
    late = order[RANGES // 2 :]  # class 7's rows all in sub-ranges read only once half the ring is
    seven = np.flatnonzero(table["label"] == 7)
    table["_range"][seven] = late[np.arange(len(seven)) % len(late)]
    picks: list[list[int]] = []
    _scan(monkeypatch, table, picks)
    _cols, report = _sample(table, 500)
    assert len(picks) > 2
    assert report.scanned > 0.5
    assert sum(len(p) for p in picks) == round(report.scanned * RANGES)  # each sub-range read once
    assert len({r for p in picks for r in p}) == round(report.scanned * RANGES)
    assert set(report.balance["per_class"].values()) == {10}


def test_where_the_first_share_is_the_whole_ring_the_choice_is_the_full_scan_s(monkeypatch: pytest.MonkeyPatch) -> None:
    table, picks = _table([12] + [200] * 9), []  # a class of 12 rows and a quota of 10: read every row
    _scan(monkeypatch, table, picks)
    cols, report = _sample(table, 100)
    assert report.scanned == 1.0
    assert len(picks) == 1
    full = BalancedSample(100, 0, _empty())
    full.add({k: v for k, v in table.items() if k != "_range"})
    expected, _ = full.result()
    assert np.array_equal(cols["id"], expected["id"])
