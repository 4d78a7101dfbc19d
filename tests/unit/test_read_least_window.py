"""A reader's least window: its rate is a throughput only once its measured batches span the seconds the window
benchmark showed it needs (defaults.CHECK_LEAST_WINDOW_S), and a check that cannot give it that long does not start
it (imgest.readback.budget, imgest.readback.check.starts)."""

from __future__ import annotations

import time

import pytest

from imgest.core import defaults
from imgest.readback import budget
from imgest.readback.budget import CheckClock, ReaderBudget, ReadPlan, least_window
from imgest.readback.check import starts

BATCH, W, M = 64, 2, 8


def _plan(seconds: float, least: float, total: int = 100_000, deadline: float | None = None) -> ReadPlan:
    return ReadPlan(ReaderBudget(seconds, W, M, deadline, window_seconds=0.2), total, start=0.0, least=least)


def _feed(plan: ReadPlan, step: float, most: int = 1_000) -> int:
    """Batches of BATCH images every STEP seconds until PLAN stops (at most MOST): how many it took."""
    for k in range(1, most + 1):
        if not plan.more(BATCH, now=step * k):
            return k
    return most


def test_the_least_windows_are_the_benchmark_s() -> None:
    assert least_window("cassandra", "raw") == 1.0
    assert least_window("cassandra-simple", "raw") == 4.0
    assert least_window("cassandra", "train") == 0.5
    assert least_window("cassandra-simple", "train") == 2.0
    assert least_window("shards-s3-stream", "raw") == 0.5
    assert least_window("shards-s3-webdataset", "train") == 0.25
    assert least_window("files", "raw") == defaults.CHECK_LEAST_WINDOW_DEFAULT_S  # not measured: the default


def test_a_reader_reads_its_least_window_whatever_its_share() -> None:
    """A 0.1 s share, a batch every 1/32 s: its 8 window batches span 0.25 s, under its 1 s; it reads on until they
    span 1 s, then its share is long spent, and its rate is a throughput."""
    plan = _plan(0.1, least=1.0)
    taken = _feed(plan, 1 / 32)
    assert plan.stop == budget.SHARE_SPENT
    assert plan.span == 1.0
    assert taken == W + 32  # 32 measured batches of 1/32 s
    assert plan.steady
    assert plan.fields()["steady_rate"] == pytest.approx(BATCH * 32)


def test_without_a_least_window_the_same_reader_stops_at_its_window_s_batches() -> None:
    plan = _plan(0.1, least=0.0)
    assert _feed(plan, 0.02) == W + M
    assert plan.steady


def test_a_deadline_before_its_least_window_leaves_no_rate() -> None:
    """The check's deadline comes 0.94 s after the warm-up, before the 2 s cassandra-simple needs: it stops
    there, and its rate over 0.91 s is marked, never shown as its throughput."""
    plan = _plan(60.0, least=2.0, deadline=1.0)
    assert _feed(plan, 1 / 32) == 31  # the next batch would end at the deadline
    assert plan.stop == budget.CHECK_SPENT
    assert len(plan.measured) >= M
    assert plan.span < 2.0
    fields = plan.fields()
    assert fields["steady"] is False
    assert "measured batches span 0.91 s" in fields["rate_note"]
    assert (fields["steady_s"], fields["least_window_s"]) == (round(29 / 32, 3), 2.0)  # in the report's row
    assert "less than the 2.00 s this reader's rate needs to settle" in fields["rate_note"]


def test_a_sample_read_before_its_least_window_is_a_rate() -> None:
    """Its whole sample in 0.4 s: the rate over all of it is the full read's work, a throughput."""
    plan = _plan(60.0, least=1.0, total=20 * BATCH)
    assert _feed(plan, 0.02) == 20
    assert plan.stop == budget.SAMPLE_READ
    assert plan.steady


def test_no_budget_no_least_window() -> None:
    plan = ReadPlan(None, 100 * BATCH, start=0.0, least=2.0)
    assert _feed(plan, 0.001) == 100
    assert plan.least == 0.0


def test_a_turn_that_cannot_buy_its_least_window_is_not_run() -> None:
    """2.1 s left before the check's deadline: `cassandra` raw (0.3 s start-up and 1 s window) starts,
    `cassandra-simple` raw (0.3 s and 4 s) does not, and says why."""
    clock = CheckClock(3.0, W, M, start=time.perf_counter())  # 0.9 s tail: the readers' deadline 2.1 s from now
    clock.expect(2)
    skipped: list[str] = []
    assert starts("cassandra", "raw", budget.next_budget(clock), clock, skipped)
    assert not starts("cassandra-simple", "raw", budget.next_budget(clock), clock, skipped)
    assert skipped == [
        "cassandra-simple (raw): not run: the check's 3.0 s budget was spent before its turn, or what was left would "
        "not cover its start-up and the window its rate needs (a larger check_seconds, or from 100,000 images a "
        "longer run, buys it a measurement)"
    ]
    assert starts("cassandra-simple", "raw", None, None, skipped)  # no budget: every reader runs
