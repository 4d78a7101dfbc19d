"""The read-back check's time budget (imgest.readback.budget): the whole check's seconds, each reader's share, the
sample sized from its first batches' rate, the minimum it reads, the cut it reports; and a real pipeline cut by it
verifying every image it read."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest

from imgest.core import defaults
from imgest.readback import budget, skips
from imgest.readback.budget import CheckClock, ReaderBudget, ReadPlan, check_seconds, process_age, tail_seconds
from imgest.readback.datasets import ReadSet
from imgest.readback.pipelines import PipelineSpec
from imgest.readback.readers import ExternalBatch, run_external

BATCH = 64


W, M = 2, 8  # warm-up and window batches of these tests


def _feed(plan: ReadPlan, times: list[float], n: int = BATCH) -> list[bool]:
    """What PLAN answers after a batch of N images ending at each of TIMES."""
    return [plan.more(n, now=t) for t in times]


def _budget(seconds: float, deadline: float | None = None, window_seconds: float = 0.5) -> ReaderBudget:
    return ReaderBudget(seconds, warmup=W, window=M, deadline=deadline, window_seconds=window_seconds)


def test_the_check_is_bounded_by_its_cap_and_from_100k_images_by_its_share_of_the_run() -> None:
    assert check_seconds(60, None) == 60.0  # not in a DAG run: the cap
    assert check_seconds(60, 52.0, images=55_000) == 60.0  # below 100 k images the cap: 10 % would buy nothing
    assert check_seconds(60, 52.0, images=99_999) == 60.0
    assert check_seconds(60, 1043.8, images=1_281_167) == 60.0  # 1.33 M images into Cassandra: 10 % is 116 s
    assert check_seconds(60, 81.0, images=133_000) == 9.0  # 133 k small images into shards: 10 % of the 90 s run
    assert check_seconds(60, 0.0, images=100_000) == 1.0  # at least a second (0 would mean no budget)
    assert check_seconds(0, 900.0, images=1_000_000) == 0.0  # 0: no budget at all
    assert check_seconds(60, 81.0, images=133_000, spent=1.5) == 7.5  # the task's own start-up counts in the 10 %
    assert check_seconds(60, None, images=133_000, spent=1.5) == 60.0  # not in a run: the cap
    assert check_seconds(60, 5.0, images=133_000, spent=3.0) == 1.0  # never under the floor
    assert check_seconds(60, 81.0, images=133_000, share=0.5) == 60.0
    assert defaults.CHECK_SECONDS == 60
    assert defaults.CHECK_RUN_SHARE == 0.1
    assert defaults.CHECK_SHARE_FROM_IMAGES == 100_000


def test_a_slow_start_is_start_up_and_the_rate_is_measured_after_it() -> None:
    """The first batch took 5 s (a pipeline filling its queue), the rest 0.1 s each: the steady rate is 640
    images/s, its start-up 5 s, and it stops once the two halves of its window agree."""
    plan = ReadPlan(_budget(60.0), total=10_000, start=0.0, started=-1.0)
    times = [5.0, 5.1] + [5.1 + 0.1 * k for k in range(1, M + 1)]
    assert _feed(plan, times) == [True] * (W + M - 1) + [False]
    assert plan.stop == budget.RATE_STEADY
    fields = plan.fields()
    assert fields["startup_s"] == 6.0  # from the reader's start (its pipeline's build) to its first batch
    assert fields["warmup_s"] == 6.1
    assert fields["steady_rate"] == pytest.approx(640.0)
    assert fields["steady_batches"] == M
    assert fields["steady_images"] == M * BATCH
    assert fields["steady"] is True
    assert fields["rate_note"] == ""
    assert fields["budget_cut"] is True
    assert fields["unread"] == 10_000 - (W + M) * BATCH
    assert fields["reason"].startswith(f"its rate was steady after {M} measured batches (640.0 images/s")


def test_a_steady_rate_over_a_window_shorter_than_its_seconds_reads_on() -> None:
    """Batches of 10 ms: eight of them are 80 ms of scheduler noise; it reads on until its window spans 0.5 s."""
    plan = ReadPlan(_budget(60.0), total=100_000, start=0.0)
    times = [0.5, 0.6] + [0.6 + 0.01 * k for k in range(1, 61)]
    more = _feed(plan, times)
    stopped = more.index(False)
    assert plan.stop == budget.RATE_STEADY
    assert times[stopped] - 0.6 >= 0.5 - 1e-9
    assert stopped + 1 - W == 50  # measured batches when it stopped: 0.5 s of them


def test_a_varying_rate_reads_on_until_its_share_is_spent() -> None:
    plan = ReadPlan(_budget(3.0), total=10_000, start=0.0)
    ends, t = [], 0.0
    for k in range(40):  # each batch slower than the one before: the halves never agree
        t += 0.01 * (k + 1)
        ends.append(t)
    more = _feed(plan, ends)
    stopped = more.index(False)
    assert stopped + 1 > W + M
    assert plan.stop == budget.SHARE_SPENT
    assert plan.steady  # its window was read: a rate, though a falling one
    assert ends[stopped] <= 3.0
    assert "3.0 s share was spent" in plan.reason()


def test_a_reader_whose_rate_varies_with_the_place_reads_its_whole_share() -> None:
    """DALI's s3:// reader (its rate depends on where in the shards it reads): an even rate does not stop it, its
    share does; the check's clock hands it that share like any other's."""
    even = [0.5, 0.6] + [0.6 + 0.1 * k for k in range(1, 60)]
    plan = ReadPlan(replace(_budget(3.0), stop_when_steady=False), total=10_000, start=0.0)
    stopped = _feed(plan, even).index(False)
    assert plan.stop == budget.SHARE_SPENT
    assert even[stopped] <= 3.0 < even[stopped] + 0.1 + 0.1  # read until one more batch would pass its share
    clock = CheckClock(10.0, W, M, start=0.0)
    clock.expect(2)
    assert budget.next_budget(clock).stop_when_steady is True
    assert budget.next_budget(clock, stop_when_steady=False).stop_when_steady is False
    assert budget.next_budget(None, stop_when_steady=False) is None  # no clock: no budget


def test_a_slow_reader_reads_its_bounded_sample_and_says_so() -> None:
    plan = ReadPlan(_budget(0.5), total=10_000, start=0.0)
    times = [1.0 * k for k in range(1, W + M + 1)]  # a batch a second: its window alone takes 10 s
    more = _feed(plan, times)
    assert more == [True] * (W + M - 1) + [False]
    assert plan.steady
    assert plan.fields()["steady_rate"] == pytest.approx(BATCH / 1.0)
    assert "bounded sample" in plan.reason()
    assert "took 10.0 s, over its 0.5 s share" in plan.reason()


def test_the_check_s_deadline_stops_a_reader_before_its_window_and_its_rate_is_not_one() -> None:
    plan = ReadPlan(_budget(60.0, deadline=4.5), total=10_000, start=0.0)
    # a batch a second: after the one ending at 4.0 the next would end at 5.0, past the deadline: it stops there
    assert _feed(plan, [1.0, 2.0, 3.0, 4.0]) == [True, True, True, False]
    assert plan.stop == budget.CHECK_SPENT
    fields = plan.fields()
    assert fields["steady"] is False
    assert fields["steady_batches"] == 2
    assert fields["rate_note"].startswith("not a steady rate: 2 batches measured after its 2 warm-up batches")
    assert "the check's budget was spent first" in fields["rate_note"]


def test_a_reader_with_a_teardown_stops_where_its_teardown_or_its_drain_would_pass_the_deadline() -> None:
    def plan(deadline: float, **after: float) -> ReadPlan:
        reads_on = replace(_budget(60.0, deadline=deadline), stop_when_steady=False, **after)
        return ReadPlan(reads_on, total=10_000, start=0.0)

    # a teardown of 1.5 s: after the batch ending at 2.0 the next would end at 3.0, and its teardown at 4.5
    short = plan(4.5, after=1.5)
    assert _feed(short, [1.0, 2.0]) == [True, False]
    assert short.stop == budget.CHECK_SPENT
    # batches of 1 s whose reads in flight (drain 1.5 batches) take 1.5 s: the teardown's figure holds
    quiet = plan(20.0, after=1.5, drain=1.5)
    assert _feed(quiet, [float(t) for t in range(1, 19)]) == [True] * 17 + [False]  # 18 + 1 + 1.5 >= 20
    # the server slows down to batches of 2 s, whose reads in flight take 3 s: more than the 1.5 s it was given
    busy = plan(20.0, after=1.5, drain=1.5)
    times = [1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0]
    assert _feed(busy, times) == [True] * 9 + [False]  # 16 + 2 + 3 >= 20, where 16 + 2 + 1.5 would read on
    assert busy.stop == budget.CHECK_SPENT
    # a first batch of 8 s is start-up, not a batch whose reads in flight are 1.5 x 8 s: it reads on
    late = plan(20.0, after=1.5, drain=1.5)
    assert _feed(late, [8.0, 9.0]) == [True, True]


def test_bursty_batches_are_judged_by_the_longest_recent_one_not_the_last() -> None:
    """Parallel pipelines' batches come in bursts (DALI's s3:// reader: 1.1 s, then three of 0.1 s): after a short
    batch the next may be a long one, so the time another batch needs is the longest of the last RECENT_BATCHES."""
    reads_on = replace(_budget(60.0, deadline=10.0), stop_when_steady=False, after=0.05, drain=1.0)
    plan = ReadPlan(reads_on, total=10_000, start=0.0)
    times = [1.0, 2.1, 2.2, 2.3, 2.4, 3.5, 3.6, 3.7, 3.8, 4.9, 5.0, 5.1, 5.2, 6.3, 6.4, 6.5, 6.6, 7.7, 7.8]
    # at 7.8 the last batch took 0.1 s (which would read on: 7.8 + 0.2 < 10), the longest of the last four 1.1 s
    assert _feed(plan, times) == [True] * 18 + [False]  # 7.8 + 1.1 + 1.1 >= 10
    assert budget.RECENT_BATCHES == 4


def test_a_reader_that_reads_its_whole_small_sample_is_not_cut_and_not_steady() -> None:
    plan = ReadPlan(_budget(5.0), total=150, start=0.0)
    assert _feed(plan, [0.1, 0.2]) == [True, True]
    assert plan.more(22, now=0.3) is False  # the sample's end: every image read
    assert not plan.cut
    assert plan.stop == budget.SAMPLE_READ
    fields = plan.fields()
    assert fields["reason"] == ""
    assert fields["unread"] == 0
    assert fields["steady"] is False  # one batch after its warm-up: start-up, not a throughput
    assert "its sample ended first" in fields["rate_note"]


def test_no_budget_reads_the_whole_sample_and_measures_after_the_warm_up() -> None:
    plan = ReadPlan(None, total=12 * BATCH, start=0.0)
    times = [10.0, 11.0] + [11.0 + 0.5 * k for k in range(1, 11)]
    assert _feed(plan, times) == [True] * 11 + [False]
    assert not plan.cut
    fields = plan.fields()
    assert fields["budget_s"] == 0.0
    assert fields["steady_rate"] == pytest.approx(10 * BATCH / 5.0)
    assert fields["steady"] is True


def test_halves_agree_only_within_the_tolerance() -> None:
    even = [(64, 0.1 * k) for k in range(1, 9)]
    assert budget.halves_agree(even, 0.0)
    slowing = [(64, t) for t in (0.1, 0.2, 0.3, 0.4, 0.6, 0.8, 1.0, 1.2)]
    assert not budget.halves_agree(slowing, 0.0)  # 640 then 320 images/s
    assert not budget.halves_agree(even[:1], 0.0)


def test_clock_shares_what_is_left_between_the_readers_still_to_run() -> None:
    clock = CheckClock(10.0, warmup=W, window=M, start=0.0)  # 8 s for readers, 2 s kept for the report and the exit
    clock.expect(4)
    assert clock.next(now=0.0) == ReaderBudget(2.0, W, M, 8.0)
    assert clock.next(now=5.0) == ReaderBudget(1.0, W, M, 8.0)  # the first ran long: the others share the rest
    assert clock.next(now=6.0) == ReaderBudget(1.0, W, M, 8.0)
    assert clock.next(now=7.5) == ReaderBudget(0.5, W, M, 8.0)
    clock.expect(1)
    assert clock.next(now=12.0) == ReaderBudget(0.0, W, M, 8.0)  # past the deadline
    clock.set_seconds(20.0)  # the sample's count known: the budget it allows
    assert clock.deadline == pytest.approx(18.0)
    assert CheckClock(0.0).next() is None  # no budget


def test_a_last_reader_keeps_its_reserve_when_the_readers_before_it_spend_their_shares() -> None:
    """DALI's s3:// reader runs last and takes seconds to start: its reserve is kept out of the shares of the four
    readers before it, so that reading their whole shares (or overrunning them a little) leaves it its start-up and
    window."""
    clock = CheckClock(10.0, warmup=W, window=M, start=0.0)  # 8 s for readers
    clock.expect(4)
    clock.expect(1, reserve=3.0)
    first = clock.next(now=0.0)
    assert first.seconds == pytest.approx(1.0)  # (8 - 3) / 5
    now = 0.0
    for _ in range(3):  # each reads its whole share and a little more
        now += first.seconds + 0.1
        clock.next(now=now)
    now = 4.6
    last = clock.next(now=now, reserve=3.0)
    assert last.seconds == pytest.approx(3.0 + (8.0 - 4.6 - 3.0))  # its reserve and what the others left of theirs
    assert budget.spent_before(last, now=now, startup=2.0) is False
    unreserved = CheckClock(10.0, warmup=W, window=M, start=0.0)
    unreserved.expect(5)
    for k in range(4):
        unreserved.next(now=k * 1.7)
    assert unreserved.next(now=7.0).seconds == pytest.approx(1.0)  # without the reserve: starved
    late = CheckClock(10.0, warmup=W, window=M, start=0.0)
    late.expect(1)
    late.expect(1, reserve=3.0)
    late.next(now=0.0)
    assert late.next(now=7.0, reserve=3.0).seconds == pytest.approx(1.0)  # never past the deadline


def test_a_reader_that_overruns_its_share_stops_before_the_reserve_of_the_readers_after_it() -> None:
    """CI run of 2026-12-06 (two suites on two cores): the readers before DALI's second mode read their warm-up and
    window past their shares, and DALI (train) was not run. The later readers' reserves are a hard stop for the
    readers before them: a slow reader ends there, not steady, saying why, and the last one keeps its reserve."""
    clock = CheckClock(10.0, warmup=W, window=M, start=0.0)  # 8 s for readers
    clock.expect(1)
    clock.expect(2, reserve=2.5)
    first = clock.next(now=0.0)
    assert (first.deadline, first.kept) == (pytest.approx(3.0), pytest.approx(5.0))
    slow = ReadPlan(first, total=10_000, start=0.0)
    ends = [0.9 * k for k in range(1, 20)]  # 0.9 s a batch: its window would take 9 s
    stopped = next(k for k, end in enumerate(ends) if not slow.more(BATCH, now=end))
    assert ends[stopped] <= 3.0
    assert slow.stop == budget.CHECK_SPENT
    assert slow.steady is False
    assert "(the check's time before the 5.0 s kept for the readers after it was spent first)" in slow.rate_note()
    second = clock.next(now=ends[stopped], reserve=2.5)
    assert (second.deadline, second.kept) == (pytest.approx(5.5), pytest.approx(2.5))
    assert second.seconds == pytest.approx(2.5 + (8.0 - 2.7 - 5.0) / 2)  # its reserve and half of what is free
    last = clock.next(now=5.5, reserve=2.5)
    assert (last.deadline, last.kept, last.seconds) == (pytest.approx(8.0), 0.0, pytest.approx(2.5))
    assert budget.spent_before(last, now=5.5, startup=2.0) is False


def test_a_reader_s_start_up_is_part_of_its_share() -> None:
    """DALI's s3:// pipelines took 6-9 s to build on a busy machine, on top of a 20 s share: its share counts from
    its own start, so the reader after it gets the time."""
    plan = ReadPlan(replace(_budget(10.0), stop_when_steady=False), total=10_000, start=6.0, started=0.0)
    ends = [6.0 + 0.2 * k for k in range(1, 60)]  # its warm-up and window end at 8 s
    stopped = _feed(plan, ends).index(False)
    assert plan.stop == budget.SHARE_SPENT
    assert ends[stopped] <= 10.0 < ends[stopped] + 0.2 + 0.2  # 10 s from its start, not from its first batch
    assert plan.fields()["startup_s"] == 6.2


def test_tail_kept_for_the_report_and_the_exit() -> None:
    """10 % of a long budget, at least 2 s of a short one, never more than 30 % of it."""
    assert tail_seconds(60.0) == pytest.approx(6.0)
    assert tail_seconds(8.2) == pytest.approx(2.0)
    assert tail_seconds(1.0) == pytest.approx(0.3)
    assert CheckClock(60.0, start=0.0).deadline == pytest.approx(54.0)


def _read_set(n: int) -> tuple[ReadSet, list[np.ndarray]]:
    images = [np.frombuffer(f"image {i} ".encode() * (i + 1), np.uint8) for i in range(n)]
    ids = np.array([f"id-{i:04d}".encode() for i in range(n)], dtype="S")
    sha = np.array([np.frombuffer(hashlib.sha256(im.tobytes()).digest(), np.uint8) for im in images])
    rows = {"id": ids, "label": (np.arange(n) % 3).astype(np.int32), "sha256": sha, "recorded": np.ones(n, bool)}
    return ReadSet("cassandra", "ks.data", rows), images


def _batches(rs: ReadSet, images: list[np.ndarray], size: int, closed: list[bool]) -> Iterator[ExternalBatch]:
    try:
        for at in range(0, len(rs), size):
            ids = [i.decode() for i in rs.ids[at : at + size].tolist()]
            yield images[at : at + size], rs.labels[at : at + size].copy(), ids, [None] * len(ids)
    finally:
        closed.append(True)


@pytest.mark.parametrize("bad", [False, True])
def test_a_cut_reader_verifies_every_image_it_read(bad: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(defaults.CHECK_LEAST_WINDOW_S, ("cassandra", "raw"), 0.0)  # cut at its window's batches
    rs, images = _read_set(100)
    if bad:
        images[3] = images[4]  # a wrong byte in what the reader does read still fails it
    closed: list[bool] = []
    spec = PipelineSpec(batch_size=8, num_threads=1, mode="raw")
    batches = _batches(rs, images, 8, closed)
    result = run_external("cassandra", rs, spec, batches, {}, budget=ReaderBudget(0.0, W, M))
    assert result.images == (W + M) * 8  # its warm-up and window whatever its share, then it stopped
    assert result.budget_cut
    assert result.unread == 100 - (W + M) * 8
    assert f"read {(W + M) * 8} of the 100 images of the sample" in result.reason
    assert closed == [True]  # the reader behind the batches was stopped
    if bad:
        assert not result.ok
        assert any(p.startswith("id-0003: sha256") for p in result.problems)
    else:
        assert result.ok, result.problems
        assert result.images_verified == result.images  # every image read, checked; the unread not missing
        assert result.problems == []


def _slow_first(batches: Iterator[ExternalBatch], delay: float) -> Iterator[ExternalBatch]:
    """BATCHES with DELAY seconds before the first (a reader's slow start: a connection, a pipeline's queue)."""
    time.sleep(delay)
    yield from batches


def test_a_reader_with_a_slow_first_batch_is_reported_at_its_steady_rate() -> None:
    """0.5 s injected before the first batch: it is start-up (startup_s), not in the steady rate, and the steady
    rate (what the report shows as the reader's throughput) is above the epoch's wall rate, which includes it."""
    rs, images = _read_set(200)
    closed: list[bool] = []
    spec = PipelineSpec(batch_size=8, num_threads=1, mode="raw")
    batches = _slow_first(_batches(rs, images, 8, closed), 0.5)
    result = run_external("cassandra", rs, spec, batches, {}, budget=ReaderBudget(60.0, W, M))
    assert result.ok, result.problems
    assert result.startup_s >= 0.5
    assert result.warmup_batches == W
    assert result.steady
    assert result.steady_batches >= M
    measured_s = result.steady_images / result.steady_rate
    assert measured_s <= result.seconds - 0.5  # the window left the delay out
    assert result.steady_rate > result.images_per_s
    assert result.batch_images[:W] == [8, 8]
    assert len(result.batch_ends) == result.images // 8


def test_without_a_budget_every_id_must_come() -> None:
    rs, images = _read_set(40)
    closed: list[bool] = []
    spec = PipelineSpec(batch_size=8, num_threads=1, mode="raw")
    whole = run_external("cassandra", rs, spec, _batches(rs, images, 8, closed), {})
    assert whole.ok
    assert whole.images == whole.images_verified == 40
    assert not whole.budget_cut
    short = _read_set(41)[0]  # a ReadSet with one id no batch holds
    result = run_external("cassandra", short, spec, _batches(rs, images, 8, closed), {})
    assert not result.ok
    assert result.problems == ["1 ids never read, e.g. id-0040"]


def test_process_age_counts_from_the_process_s_own_start() -> None:
    import subprocess
    import sys

    code = "import time; time.sleep(0.5); from imgest.readback.budget import process_age; print(process_age())"
    child = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 0.4 < child < process_age()  # a fresh process: its half-second sleep, less than this test process's age


def test_a_reader_whose_turn_comes_after_the_deadline_is_not_started() -> None:
    """DALI's s3:// pipelines take seconds to build: past the check's deadline the check does not start them (it
    keeps to its budget) and says why in its ``skipped`` line."""
    clock = CheckClock(4.9, W, M, start=0.0)
    clock.expect(1)
    share = budget.next_budget(clock)
    assert not budget.spent_before(share, now=clock.deadline - 0.01)
    assert budget.spent_before(share, now=clock.deadline)
    assert budget.spent_before(share, now=clock.deadline - 1.9, startup=2.0)  # left: less than its start-up
    assert not budget.spent_before(share, now=clock.deadline - 2.1, startup=2.0)
    assert not budget.spent_before(None, now=1e9)  # no budget: every reader runs
    line = skips.not_run("shards-s3-dali", "train", clock)
    assert line.startswith("shards-s3-dali (train): not run: the check's 4.9 s budget was spent before its turn, or")
