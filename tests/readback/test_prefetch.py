"""The Cassandra reader's epochs follow each other without a gap, against the real Cassandra: the next epoch's
first rows are requested before the current epoch's last batch is handed over (the first epoch's at open), every
epoch still delivers exactly its rows, each once, and rows requested ahead never reach another epoch or order."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from imgest.readback.cassandra import CassandraReader, CassandraReadOptions, epoch_order
from imgest.readback.datasets import ReadSet, cassandra_set
from imgest.readback.resumable import CassandraResume
from imgest.readback.resume import ReaderState
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sinks.cassandra.schema import TableLayout
from tests.readback.conftest import DATASET, KEYSPACE

pytestmark = [pytest.mark.services]


@pytest.fixture(scope="module")
def rs(stored: dict[str, Any]) -> ReadSet:
    with cassandra_session(stored["cassandra"]) as session:
        return cassandra_set(session, TableLayout(KEYSPACE), DATASET)


def _ids(rs: ReadSet, positions: np.ndarray) -> list[str]:
    return [rs.ids[i].decode() for i in positions]


@pytest.mark.parametrize(
    "knobs",
    [
        {"prefetch_buffers": 2, "ooo": True},  # a window of 8 rows: room for the next epoch only as this one drains
        {"prefetch_buffers": 2, "ooo": False},
        {"slow_start": 2},  # the adaptive default
    ],
)
def test_next_epoch_is_requested_before_the_last_batch_and_each_epoch_reads_its_rows_once(
    stored: dict[str, Any], rs: ReadSet, knobs: dict[str, Any]
) -> None:
    opts = CassandraReadOptions(batch_size=4, rows_per_request=2, seed=5, **knobs)
    with CassandraReader(stored["cassandra"], rs.table, rs.ids, rs.labels, opts) as reader:
        assert reader.requested_ahead >= 4  # the first epoch's rows went out at open
        batches_per_epoch = len(reader)
        for epoch in range(3):
            want = _ids(rs, epoch_order(rs.ids, rs.labels, opts, epoch))
            batches = reader.epoch_batches()
            assert reader.started_ahead > 0  # this epoch was requested before it was asked for
            got: list[list[str]] = []
            ahead_before_last = -1
            for images, labels, ids in batches:
                assert len(images) == len(labels) == len(ids)
                got.append(ids)
                if len(got) == batches_per_epoch - 1:  # the last batch of this epoch is not handed over yet
                    ahead_before_last = reader.requested_ahead
            flat = [i for ids in got for i in ids]
            assert len(got) == batches_per_epoch
            assert sorted(flat) == sorted(want)  # exactly this epoch's rows ...
            assert len(set(flat)) == len(flat) == stored["train"]  # ... each once
            if not opts.ooo:
                assert flat == want  # in-order mode keeps each epoch's seeded order
            assert ahead_before_last >= 2  # epoch N+1 had requests out before epoch N's last batch
            assert reader.window_stats is not None  # each epoch's course of the one window, for the bench


def test_rows_requested_ahead_never_leak_into_another_order_or_epoch(stored: dict[str, Any], rs: ReadSet) -> None:
    opts = CassandraReadOptions(batch_size=4, prefetch_buffers=2, rows_per_request=2, seed=9)
    with CassandraReader(stored["cassandra"], rs.table, rs.ids, rs.labels, opts) as reader:
        assert reader.requested_ahead > 0  # the seeded first epoch, requested at open
        other = np.arange(len(rs.ids))[::-2]  # not that order: what was requested ahead is dropped unseen
        got = [i for _, _, ids in reader.epoch_batches(order=other) for i in ids]
        assert sorted(got) == sorted(_ids(rs, other))
        assert len(set(got)) == len(got)
        assert reader.started_ahead == 0
        first = reader.epoch_batches()  # the seeded epoch 0, stopped at 40 %
        part = [i for _, (_, _, ids) in zip(range(6), first, strict=False) for i in ids]
        first.close()
        assert set(part) <= set(_ids(rs, epoch_order(rs.ids, rs.labels, opts, 0)))
        assert len(set(part)) == len(part) == 24
        rest = [i for _, _, ids in reader.epoch_batches() for i in ids]  # epoch 1: whole, nothing of epoch 0
        assert sorted(rest) == sorted(_ids(rs, epoch_order(rs.ids, rs.labels, opts, 1)))
        assert len(set(rest)) == len(rest) == stored["train"]


def test_a_resumed_rank_gets_its_next_epoch_requested_ahead(stored: dict[str, Any], rs: ReadSet) -> None:
    opts = CassandraReadOptions(batch_size=4, prefetch_buffers=2, rows_per_request=2)
    state = ReaderState(seed=3, world_size=2)
    reader = CassandraReader(stored["cassandra"], rs.table, rs.ids, rs.labels, opts)
    try:
        for epoch in range(3):
            state.set_epoch(epoch)
            resume = CassandraResume(reader, state, rank=1)
            want = _ids(rs, resume.assignment().unit)
            got = [i for batch in resume.batches() for i in batch.ids]
            assert sorted(got) == sorted(want)
            assert len(set(got)) == len(got) == stored["train"] // 2
            assert state.samples_done() == [0, len(want)]
            if epoch:
                assert reader.started_ahead > 0  # requested while the epoch before drained
    finally:
        reader.close()
