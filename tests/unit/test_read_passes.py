"""A reader whose whole sample takes less than its least window reads it again (imgest.readback.passes): how many
passes, what the one result over them says, and when no pass more is read."""

from __future__ import annotations

import time

from imgest.readback.budget import CHECK_SPENT, SAMPLE_READ, ReaderBudget, least_window
from imgest.readback.measure import RunResult
from imgest.readback.passes import MAX_PASSES, read_passes

SAMPLE = 1000


def _pass(steady_s: float, stop: str = SAMPLE_READ, problems: list[str] | None = None) -> RunResult:
    """One read of a SAMPLE-image sample: 2 warm-up batches of 100 (0.05 s), then 8 measured over STEADY_S."""
    steady = 800 / steady_s
    return RunResult(
        "cassandra",
        "raw",
        "cpu",
        images=SAMPLE,
        bytes=SAMPLE * 1000,
        seconds=round(0.05 + steady_s, 3),
        epoch_rate=steady,
        startup_s=0.02,
        warmup_batches=2,
        steady_batches=8,
        steady_images=800,
        steady_s=steady_s,
        steady_rate=round(steady, 1),
        steady=True,
        stop=stop,
        batch_ends=[0.025 * (i + 1) for i in range(2)] + [0.05 + steady_s * (i + 1) / 8 for i in range(8)],
        batch_images=[100] * 10,
        images_verified=SAMPLE,
        problems=problems or [],
        ok=not problems,
        batch_ms_p50=10.0,
        batch_ms_p99=20.0,
        cpu_cores=1.0,
    )


class Passes:
    """A reader that reads its sample in the seconds given, one per call (the last repeated)."""

    def __init__(self, *spans: float, problems_at: int = -1) -> None:
        self.spans, self.calls, self.problems_at = spans, 0, problems_at

    def __call__(self) -> RunResult:
        span = self.spans[min(self.calls, len(self.spans) - 1)]
        problems = ["id7: sha256 ab..., recorded cd..."] if self.calls == self.problems_at else None
        self.calls += 1
        return _pass(span, problems=problems)


def test_without_a_budget_a_reader_reads_its_sample_once_unless_asked() -> None:
    reads = Passes(0.3)
    result = read_passes("cassandra", "raw", None, False, reads)
    assert reads.calls == 1
    assert result.passes == 1
    assert result.images == SAMPLE
    assert result.steady


def test_a_sample_read_in_less_than_the_least_window_is_read_again_until_the_reads_span_it() -> None:
    least = least_window("cassandra", "raw")  # 1 s
    reads = Passes(0.3, 0.4, 0.35)
    result = read_passes("cassandra", "raw", None, True, reads)
    assert reads.calls == 3  # 0.3 + 0.4 < 1 s; + 0.35 reaches it
    assert result.passes == 3
    assert result.settings["passes"] == 3
    assert result.images == 3 * SAMPLE
    assert result.images_verified == SAMPLE
    assert result.steady_s == 1.05 >= least
    assert result.steady_images == 3 * 800
    assert result.steady_rate == round(2400 / 1.05, 1)  # every pass's steady part over the seconds they span
    assert result.steady
    assert result.rate_note == ""
    assert result.least_window_s == least
    assert result.stop == "sample read 3 times"
    assert not result.budget_cut
    assert len(result.batch_ends) == 30
    assert result.batch_ends == sorted(result.batch_ends)
    assert result.startup_s == 0.02
    assert result.warmup_batches == 2


def test_a_budget_reads_again_as_the_least_window_needs() -> None:
    budget = ReaderBudget(5.0, deadline=time.perf_counter() + 30)
    reads = Passes(0.6)
    result = read_passes("cassandra", "raw", budget, False, reads)  # a budget always settles
    assert reads.calls == 2
    assert result.steady
    assert result.steady_s == 1.2


def test_a_sample_too_small_to_reach_the_window_in_max_passes_is_read_once() -> None:
    reads = Passes(0.01)  # a test's handful of images: MAX_PASSES reads would not span 1 s
    result = read_passes("cassandra", "raw", ReaderBudget(5.0, deadline=time.perf_counter() + 30), True, reads)
    assert reads.calls == 1
    assert result.passes == 1
    assert result.steady
    assert least_window("cassandra", "raw") > 0.01 * MAX_PASSES


def test_at_most_max_passes() -> None:
    reads = Passes(0.25, 0.1)  # the first reaches a quarter of the window, the others fall short
    result = read_passes("cassandra", "raw", None, True, reads)
    assert reads.calls == MAX_PASSES == result.passes
    assert not result.steady
    assert "span 0.55 s" in result.rate_note


def test_a_deadline_that_leaves_no_pass_more_leaves_no_rate() -> None:
    budget = ReaderBudget(5.0, deadline=time.perf_counter() + 0.2)  # another 0.35 s pass would end past it
    reads = Passes(0.3)
    result = read_passes("cassandra", "raw", budget, False, reads)
    assert reads.calls == 1
    assert not result.steady
    assert "its read of its whole sample span 0.30 s" in result.rate_note
    assert "deadline" in result.rate_note
    assert result.steady_rate == round(800 / 0.3, 1)  # measured all the same, marked not a throughput


def test_a_pass_with_problems_ends_the_passes_and_says_which() -> None:
    reads = Passes(0.3, problems_at=1)
    result = read_passes("cassandra", "raw", None, True, reads)
    assert reads.calls == 2
    assert not result.ok
    assert result.problems == ["pass 2: id7: sha256 ab..., recorded cd..."]


def test_a_last_pass_the_deadline_cut_still_counts_what_it_measured() -> None:
    budget = ReaderBudget(5.0, deadline=time.perf_counter() + 30)
    first, cut = _pass(0.6), _pass(0.5, stop=CHECK_SPENT)
    calls = iter([first, cut])
    result = read_passes("cassandra", "raw", budget, False, lambda: next(calls))
    assert result.passes == 2
    assert result.steady
    assert result.steady_s == 1.1
    assert result.stop == f"sample read 2 times (the last pass stopped: {CHECK_SPENT})"
    assert not result.budget_cut
