"""The latency sweep's figures: each epoch of a run and all of them together, medians of the rounds, and the
targets stated per epoch (no service: the rounds' results are given)."""

from __future__ import annotations

import statistics

from imgest.bench.read_sweep import all_epochs_row, epoch_name, epoch_row, kept_under_latency, targets
from imgest.readback.measure import RunResult


def _run(rate: float, first_ms: float = 5.0) -> RunResult:
    return RunResult(
        "cassandra", "raw", "cpu", images=1000, epoch_rate=rate, second_half_rate=rate, first_batch_ms=first_ms
    )


def _rows(condition: str, rounds: list[list[RunResult]]) -> list[dict]:
    base = {"condition": condition, "reader": "cassandra", "window": "adaptive"}
    rows = [{**base, **epoch_row(k, [r[k] for r in rounds])} for k in range(len(rounds[0]))]
    return [*rows, {**base, **all_epochs_row(rounds)}]


def test_each_epoch_is_the_median_of_its_rounds_and_all_is_the_time_weighted_rate() -> None:
    rounds = [[_run(100), _run(200), _run(200)], [_run(80), _run(180), _run(220)], [_run(120), _run(190), _run(210)]]
    rows = _rows("0 ms", rounds)
    assert [r["epoch"] for r in rows] == ["first", "second", "third", "all"]
    assert [r["images_per_s"] for r in rows[:3]] == [100, 190, 210]
    assert (rows[0]["min"], rows[0]["max"]) == (80, 120)
    per_round = [statistics.harmonic_mean([r.epoch_rate for r in epochs]) for epochs in rounds]
    assert rows[3]["images_per_s"] == round(statistics.median(per_round), 1)
    assert rows[3]["images"] == 3000
    assert rows[3]["images_per_s"] < statistics.mean(r["images_per_s"] for r in rows[:3])  # a slow epoch weighs more
    assert epoch_name(11) == "12th"


def test_targets_are_stated_for_every_epoch_and_all_epochs() -> None:
    zero = _rows("0 ms", [[_run(100), _run(100), _run(100)]] * 3)
    far = _rows("50 ms", [[_run(70), _run(95), _run(95)]] * 3)
    kept = kept_under_latency(zero + far)
    assert {k["epoch"]: k["vs_0ms"] for k in kept if k["condition"] == "50 ms"} == {
        "first": 0.7,
        "second": 0.95,
        "third": 0.95,
        "all": 0.85,  # 3 / (1/70 + 2/95) = 84.9 images/s: the slow first epoch weighs by its time
    }
    got = targets(kept)
    assert got["cassandra default, first epoch, at 50 ms (target >= 0.85)"]["met"] is False
    assert got["cassandra default, second epoch, at 50 ms (target >= 0.85)"]["met"] is True
    assert got["cassandra default, all epochs, at 50 ms (target >= 0.85)"] == {
        "kept": 0.85,
        "met": True,
        "steady_state_kept": None,
    }
