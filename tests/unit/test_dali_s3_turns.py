"""The turns of DALI's s3:// reader in the read-back check (imgest.readback.dali_s3): a turn starts only where what
is left before the check's deadline covers its start-up (with its margin) and teardown (the defaults, then the first
turn's own figures), and stops reading early enough for its teardown, or its reads in flight, to end inside the check.

The reader itself is replaced by a stand-in that returns a result and moves the check's clock: what is tested is
the order of turns and the budgets handed to them (the real reader under a real budget: tests/readback/
test_parallel_dali.py and the 55 k DAG run, tests/dags/test_read_check_dag.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from imgest.core import defaults
from imgest.readback import dali_s3
from imgest.readback.budget import CheckClock, ReaderBudget
from imgest.readback.dali_s3 import DRAIN_BATCHES, STARTUP_MARGIN, TurnCost, dali_s3_runs
from imgest.readback.measure import RunResult
from imgest.readback.pipelines import PipelineSpec

RESERVE = defaults.CHECK_DALI_S3_RESERVE_S
MODES = [("raw", PipelineSpec(16, 1, "raw")), ("train", PipelineSpec(16, 1, "train"))]


def _clock() -> CheckClock:
    clock = CheckClock(100.0)  # readers' deadline 90 s from now (a tail of 10)
    clock.expect(2, reserve=RESERVE)
    return clock


def _stand_in(clock: CheckClock, left_after_first: float, budgets: list[ReaderBudget | None]) -> Any:
    """A reader whose first turn measured a 6.0 s start-up and a 2.5 s teardown, and after which LEFT_AFTER_FIRST
    seconds are left before the check's deadline."""

    def run(rs: Any, settings: Any, where: str, spec: PipelineSpec, **kw: Any) -> RunResult:
        budgets.append(kw["budget"])
        if len(budgets) == 1:
            clock.deadline = time.perf_counter() + left_after_first
        return RunResult("shards-s3-dali", spec.mode, "cpu", startup_s=6.0, teardown_s=2.5)

    return run


def test_a_turn_is_not_started_when_what_is_left_would_not_cover_the_last_turns_start_up_and_teardown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, budgets = _clock(), []
    deadline = clock.deadline
    monkeypatch.setattr(dali_s3, "s3_dali_run", _stand_in(clock, 11.0, budgets))  # 11.0 < 1.5 x 6.0 + 2.5
    results, skipped = dali_s3_runs(None, None, "s3://b/p", MODES, clock=clock)  # type: ignore[arg-type]
    assert [r.mode for r in results] == ["raw"]
    assert len(skipped) == 1
    assert skipped[0].startswith("shards-s3-dali (train): not run: the check's 100.0 s budget was spent"), skipped
    assert skipped[0].endswith("it needs 6.0 s start-up (x1.5) and 2.5 s teardown"), skipped
    # the first turn stops reading where its (default) teardown, or its reads in flight, would reach the reserve
    # kept for the second
    first = budgets[0]
    assert first is not None
    assert first.deadline is not None
    assert first.deadline == pytest.approx(deadline - RESERVE)
    assert (first.after, first.drain) == (defaults.CHECK_DALI_S3_TEARDOWN_S, DRAIN_BATCHES)


def test_a_turn_that_fits_reads_until_the_deadline_less_the_teardown_its_first_turn_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, budgets = _clock(), []
    monkeypatch.setattr(dali_s3, "s3_dali_run", _stand_in(clock, 12.0, budgets))  # 12.0 > 1.5 x 6.0 + 2.5
    results, skipped = dali_s3_runs(None, None, "s3://b/p", MODES, clock=clock)  # type: ignore[arg-type]
    assert ([r.mode for r in results], skipped) == (["raw", "train"], [])
    second = budgets[1]
    assert second is not None
    assert second.deadline is not None
    assert second.deadline == pytest.approx(clock.deadline)  # the last turn: nothing kept after it
    assert (second.after, second.drain) == (2.5, DRAIN_BATCHES)  # the teardown the first turn measured
    assert second.seconds <= 12.0 - 2.5 + 1e-6
    assert second.stop_when_steady is False  # its rate varies with the place: it reads its share


def test_without_a_budget_every_turn_runs_unbudgeted(monkeypatch: pytest.MonkeyPatch) -> None:
    budgets: list[ReaderBudget | None] = []
    monkeypatch.setattr(dali_s3, "s3_dali_run", _stand_in(CheckClock(0.0), 0.0, budgets))
    results, skipped = dali_s3_runs(None, None, "s3://b/p", MODES, clock=None)  # type: ignore[arg-type]
    assert (len(results), skipped, budgets) == (2, [], [None, None])


def test_the_cost_of_a_turn_is_what_the_last_one_measured() -> None:
    cost = TurnCost()
    assert (cost.startup, cost.teardown) == (defaults.CHECK_DALI_S3_STARTUP_S, defaults.CHECK_DALI_S3_TEARDOWN_S)
    cost.learn(RunResult("shards-s3-dali", "raw", "cpu", startup_s=1.2, teardown_s=0.4))
    assert (cost.startup, cost.teardown) == (1.2, 0.4)  # a quiet machine's turn needs less than the default
    budget = ReaderBudget(10.0, deadline=50.0)
    assert cost.reading(budget) == ReaderBudget(9.6, deadline=50.0, after=0.4, drain=DRAIN_BATCHES)
    assert cost.needs == pytest.approx(STARTUP_MARGIN * 1.2 + 0.4)
    assert cost.fits(ReaderBudget(10.0, deadline=float("inf")))
    assert not cost.fits(ReaderBudget(10.0, deadline=0.0))
