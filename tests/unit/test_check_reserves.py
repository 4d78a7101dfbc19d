"""What a small budget buys in the read-back check (imgest.readback.check): DALI's s3:// reader keeps its reserve only
where the budget affords a turn of it beside a least share for each reader before it (a reserve that buys no turn
starved imgest's readers at 143 k images: 64 images each), and a Cassandra reader whose turn comes too late to read
its first batch inside the check is not started.

The readers are stand-ins that record the budgets handed to them: what is tested is who runs and with what budget
(the real readers under a real budget: tests/readback/test_parallel_dali.py and tests/dags/test_read_check_dag.py)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from imgest.core import defaults
from imgest.readback import check_s3 as check
from imgest.readback.budget import LEAST_SHARE, READER_STARTUP_S, CheckClock, ReaderBudget, affords
from imgest.readback.check import ReadCheckOptions, cassandra_runs
from imgest.readback.check_s3 import s3_shard_runs
from imgest.readback.measure import RunResult

RESERVE = defaults.CHECK_DALI_S3_RESERVE_S


@pytest.mark.parametrize(("seconds", "turns"), [(4.9, 0), (30.0, 1), (60.0, 2), (0.0, 2)])
def test_a_reserve_is_kept_only_where_the_budget_buys_its_turn(seconds: float, turns: int) -> None:
    clock = CheckClock(seconds, start=0.0)
    assert clock.affords(2, RESERVE, before=4, now=0.0) == turns
    if seconds:  # what decides it: the readers' time less a least share each for the four before
        left = clock.deadline - 4 * LEAST_SHARE
        assert turns == max(0, min(2, int(left // RESERVE)))
    assert affords(None, 2, RESERVE, before=4) == 2  # no budget: every turn


def _no_import(module: str) -> threading.Thread:
    done = threading.Thread(target=lambda: None)
    done.start()
    return done


def _stand_ins(monkeypatch: pytest.MonkeyPatch, budgets: dict[str, list[ReaderBudget | None]]) -> None:
    def reader(name: str) -> Any:
        def run(rs: Any, settings: Any, bucket: str, prefix: str, spec: Any, *args: Any) -> RunResult:
            budgets.setdefault(name, []).append(args[-2])  # then settle
            return RunResult(name, spec.mode, "cpu")

        return run

    def dali(rs: Any, settings: Any, where: str, modes: list[Any], *args: Any) -> tuple[list[RunResult], list[str]]:
        budgets["shards-s3-dali"] = [None] * len(modes)
        return [RunResult("shards-s3-dali", m, "cpu") for m, _ in modes], []

    monkeypatch.setattr(check, "s3_stream_run", reader("shards-s3-stream"))
    monkeypatch.setattr(check, "s3_webdataset_run", reader("shards-s3-webdataset"))
    monkeypatch.setattr(check, "dali_s3_runs", dali)
    monkeypatch.setattr(check, "import_ahead", _no_import)


def test_a_budget_that_cannot_keep_dali_s_reserve_gives_its_time_to_the_other_readers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    budgets: dict[str, list[ReaderBudget | None]] = {}
    _stand_ins(monkeypatch, budgets)
    clock = CheckClock(4.9)  # 143 k images, shards on S3: 10 % of a 44 s run
    results, skipped = s3_shard_runs(None, None, "b", "p", ReadCheckOptions(), clock=clock)  # type: ignore[arg-type]
    assert [(r.reader, r.mode) for r in results] == [
        ("shards-s3-stream", "raw"),
        ("shards-s3-webdataset", "raw"),
        ("shards-s3-stream", "train"),
        ("shards-s3-webdataset", "train"),
    ]
    assert len(skipped) == 2
    for mode, line in zip(("raw", "train"), skipped, strict=True):
        assert line.startswith(f"shards-s3-dali ({mode}): not run: the check's 4.9 s budget cannot keep the "), line
        assert f"{RESERVE:.1f} s a turn of it needs" in line
    first = budgets["shards-s3-stream"][0]
    assert first is not None
    assert first.kept == 0.0  # nothing kept for a reader that will not run
    assert first.seconds == pytest.approx((clock.deadline - clock.start) / 4, abs=0.05)  # a quarter of it each


def test_a_budget_that_buys_one_turn_keeps_dali_s_reserve_for_raw_only(monkeypatch: pytest.MonkeyPatch) -> None:
    budgets: dict[str, list[ReaderBudget | None]] = {}
    _stand_ins(monkeypatch, budgets)
    clock = CheckClock(30.0)
    results, skipped = s3_shard_runs(None, None, "b", "p", ReadCheckOptions(), clock=clock)  # type: ignore[arg-type]
    assert [(r.reader, r.mode) for r in results if r.reader == "shards-s3-dali"] == [("shards-s3-dali", "raw")]
    assert [line.split(":", 1)[0] for line in skipped] == ["shards-s3-dali (train)"]
    first = budgets["shards-s3-stream"][0]
    assert first is not None
    assert first.kept == pytest.approx(RESERVE)  # the raw turn's reserve, kept from the readers before it


def test_a_cassandra_reader_whose_turn_comes_too_late_is_not_started() -> None:
    clock = CheckClock(5.0)
    clock.deadline = clock.start + READER_STARTUP_S / 2  # the sample's scan spent the readers' time
    skipped: list[str] = []
    results = cassandra_runs(None, None, ReadCheckOptions(), clock=clock, skipped=skipped)  # type: ignore[arg-type]
    assert results == []  # no connection made: settings None would fail one
    assert [line.split(":", 1)[0] for line in skipped] == [
        "cassandra (raw)",
        "cassandra-simple (raw)",
        "cassandra (train)",
        "cassandra-simple (train)",
    ]
    assert all("not run: the check's 5.0 s budget was spent before its turn" in line for line in skipped)
