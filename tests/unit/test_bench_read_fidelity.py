"""The check-fidelity benchmark's arithmetic (imgest.bench.read_fidelity): the check's steady rate against the full
read's, the tolerance, and the spread of the rate against the window size from a full read's batch times."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from imgest.bench.read_fidelity import TOLERANCE, compare, window_errors
from imgest.bench.read_fidelity_run import _spread
from imgest.readback.measure import RunResult


def _run(rate: float, ends: list[float], steady: bool = True, images: int = 64) -> RunResult:
    return RunResult(
        "shards-s3-stream",
        "raw",
        "cpu",
        images=images * len(ends),
        steady_rate=rate,
        steady=steady,
        warmup_batches=2,
        batch_ends=ends,
        batch_images=[images] * len(ends),
    )


def test_window_errors_are_the_rate_over_k_batches_after_the_warm_up_against_the_full_rate() -> None:
    # warm-up ends at 1.0 s; then batches of 64 every 0.1 s (640/s) for 4, then every 0.2 s (320/s)
    ends = [0.5, 1.0, 1.1, 1.2, 1.3, 1.4, 1.6, 1.8, 2.0, 2.2]
    errors = window_errors(_run(0.0, ends), 640.0, warmup=2)
    assert errors[1] == pytest.approx(0.0)
    assert errors[4] == pytest.approx(0.0)
    assert errors[8] == pytest.approx(abs(8 * 64 / 1.2 - 640) / 640)
    assert 16 not in errors  # the read had fewer batches than that


def test_compare_takes_medians_and_says_whether_the_check_is_within_the_tolerance() -> None:
    ends = [0.5, 1.0] + [1.0 + 0.1 * k for k in range(1, 11)]
    rounds = [
        {"check": [_run(rate, ends[:10])], "full": [_run(full, ends)]}
        for rate, full in ((600.0, 640.0), (500.0, 650.0), (610.0, 630.0))
    ]
    row = compare(rounds)[0]
    assert row["check_rate"] == 600.0
    assert row["full_rate"] == 640.0
    assert row["full_rates"] == [640.0, 650.0, 630.0]
    assert row["ratio"] == pytest.approx(600 / 640, abs=1e-3)
    assert row["within"] is True
    assert row["check_steady"] is True
    low = [{"check": [_run(400.0, ends[:10])], "full": [_run(640.0, ends)]}]
    assert compare(low)[0]["within"] is (abs(400 / 640 - 1) <= TOLERANCE)
    assert compare(low)[0]["within"] is False
    # a round whose check did not reach a steady rate: no result, whatever the median's ratio
    unsteady = [*rounds[:2], {"check": [_run(610.0, ends[:10], steady=False)], "full": [_run(630.0, ends)]}]
    row = compare(unsteady)[0]
    assert row["ratio"] == pytest.approx(600 / 640, abs=1e-3)
    assert row["check_steady"] is False
    assert row["within"] is False


def test_the_spread_is_the_worst_error_per_window_over_every_size_and_reader() -> None:
    sizes = [
        {"readers": [{"window_spread": {"2": 0.3, "8": 0.05}}, {"window_spread": {"2": 0.1, "8": 0.12}}]},
        {"readers": [{"window_spread": {"2": 0.2, "8": 0.02, "16": 0.01}}]},
    ]
    assert _spread(sizes) == {"2": 0.3, "8": 0.12, "16": 0.01}


def test_a_reader_the_check_did_not_run_is_matched_by_name_and_missed() -> None:
    """The check skipped DALI's reader (its budget spent before its turn): the full read's other rows still pair
    with their own check rows, and the skipped one is a miss with no rate."""
    ends = [0.5, 1.0] + [1.0 + 0.1 * k for k in range(1, 11)]
    dali = replace(_run(200.0, ends), reader="shards-s3-dali")
    rounds = [{"check": [_run(600.0, ends)], "full": [dali, _run(640.0, ends)]}]
    rows = {r["reader"]: r for r in compare(rounds)}
    assert rows["shards-s3-stream"]["check_rate"] == 600.0
    assert rows["shards-s3-stream"]["full_rate"] == 640.0
    assert rows["shards-s3-dali"]["check_stops"] == ["not run"]
    assert rows["shards-s3-dali"]["check_rate"] == 0.0
    assert rows["shards-s3-dali"]["within"] is False
    assert rows["shards-s3-dali"]["check_steady"] is False
    assert rows["shards-s3-dali"]["full_rate"] == 200.0
    assert rows["shards-s3-dali"]["reported_rounds"] == 0
    assert rows["shards-s3-dali"]["reported_within"] is True  # it told the user no figure, so no wrong one


def test_what_the_check_reported_is_judged_apart_from_what_it_measured() -> None:
    """Three rounds: steady at 400 and 420 images/s in two, not steady in the third (its 900 is start-up, marked):
    the rates it told a user were 400 and 420 against a full read's 640, 0.64, outside 20 %."""
    ends = [0.5, 1.0] + [1.0 + 0.1 * k for k in range(1, 11)]
    rounds = [
        {"check": [_run(rate, ends[:10], steady=steady)], "full": [_run(640.0, ends)]}
        for rate, steady in ((400.0, True), (420.0, True), (900.0, False))
    ]
    row = compare(rounds)[0]
    assert row["reported_rounds"] == 2
    assert row["reported_ratio"] == pytest.approx(410 / 640, abs=1e-3)
    assert row["reported_within"] is False
    good = [{"check": [_run(600.0, ends[:10])], "full": [_run(640.0, ends)]}] * 2
    assert compare(good)[0]["reported_within"] is True


class _Sample(list[int]):
    """A ReadSet's count and its sample's (one_round reads no more of it)."""

    sample = SimpleNamespace(total=140_000)


@pytest.mark.parametrize(
    ("check_runs_dali", "full_first", "dali_full", "full_reads_dali"),
    [
        (True, False, None, True),  # the uncounted round: the check first, and it ran DALI's s3:// reader
        (False, False, None, False),  # ... it did not (143 k: no turn for it): its full read is not read
        (False, True, False, False),  # a counted round, told by the uncounted one
        (True, True, True, True),
    ],
)
def test_the_full_read_settles_and_reads_dali_s3_only_where_the_check_does(
    monkeypatch: pytest.MonkeyPatch,
    check_runs_dali: bool,
    full_first: bool,
    dali_full: bool | None,
    full_reads_dali: bool,
) -> None:
    from imgest.bench import read_fidelity
    from imgest.readback import step

    calls: list[Any] = []

    def run_target(target: str, location: str, settings: Any, opts: Any, clock: Any = None) -> Any:
        calls.append(opts)
        readers = ["shards-s3-stream"] + (["shards-s3-dali"] if clock is not None and check_runs_dali else [])
        if clock is not None:
            clock.set_seconds(6.0)
        rs = _Sample(range(10_000))
        return [RunResult(r, "raw", "cpu") for r in readers], [], rs

    monkeypatch.setattr(step, "run_target", run_target)
    where = {"s3": "s3://imgest/x", "shards_run_seconds": 57.0}
    run = read_fidelity.one_round("shards", where, {}, full_first=full_first, dali_full=dali_full)
    full = [o for o in calls if o.seconds == 0]
    assert len(full) == 1
    assert len(calls) == 2
    assert full[0].settle  # its short reads read again, as the check's are
    assert full[0].dali_s3 is full_reads_dali
    assert read_fidelity.ran_dali_s3(run) is check_runs_dali
