"""The read-back check's time budget (imgest.readback.budget): the whole check's seconds, each reader's share, the
sample sized from its first batches' rate, the minimum it reads, the cut it reports; and a real pipeline cut by it
verifying every image it read."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np
import pytest

from imgest.core import defaults
from imgest.readback.budget import (
    CheckClock,
    ReaderBudget,
    ReadPlan,
    check_seconds,
    planned_images,
    process_age,
    tail_seconds,
)
from imgest.readback.datasets import ReadSet
from imgest.readback.pipelines import PipelineSpec
from imgest.readback.readers import ExternalBatch, run_external

BATCH = 64


def _feed(plan: ReadPlan, times: list[float], n: int = BATCH) -> list[bool]:
    """What PLAN answers after a batch of N images ending at each of TIMES."""
    return [plan.more(n, now=t) for t in times]


def test_the_check_is_bounded_by_its_cap_and_by_its_share_of_the_run() -> None:
    assert check_seconds(60, None) == 60.0  # not in a DAG run: the cap
    assert check_seconds(60, 1043.8) == 60.0  # 1.33 M images into Cassandra: 10 % would be 116 s
    assert check_seconds(60, 81.0) == 9.0  # 133 k small images into shards: 9 s is 10 % of the 90 s run
    assert check_seconds(60, 0.0) == 1.0  # at least a second (0 would mean no budget): readers read their minimum
    assert check_seconds(0, 900.0) == 0.0  # 0: no budget at all
    assert check_seconds(60, 81.0, spent=1.5) == 7.5  # the task's own start-up counts in the run's 10 %
    assert check_seconds(60, None, spent=1.5) == 60.0  # not in a run: the cap, whatever the start-up took
    assert check_seconds(60, 5.0, spent=3.0) == 1.0  # never under the floor
    assert check_seconds(60, 81.0, share=0.5) == 60.0
    assert defaults.CHECK_SECONDS == 60
    assert defaults.CHECK_RUN_SHARE == 0.1


def test_planned_images_are_whole_batches_the_rate_fits() -> None:
    # 128 read in 1 s; 4 s left at 100 images/s fit 400 images: 6 whole batches more
    assert planned_images(128, 1.0, 100.0, 5.0, 10_000, BATCH) == 128 + 6 * BATCH
    assert planned_images(128, 1.0, 100.0, 5.0, 300, BATCH) == 300  # never more than the sample
    assert planned_images(128, 6.0, 100.0, 5.0, 10_000, BATCH) == 128  # over budget already: what was read
    assert planned_images(128, 1.0, 0.0, 5.0, 10_000, BATCH) == 128  # no rate: nothing more


def test_plan_sizes_the_sample_from_the_rate_after_the_first_batch() -> None:
    plan = ReadPlan(ReaderBudget(5.0, min_batches=2), total=10_000, start=0.0)
    # the first batch is start-up (1 s); the second took 0.5 s: 128 images/s, 3.5 s left fit 448 images
    assert _feed(plan, [1.0, 1.5]) == [True, True]
    assert plan.rate == 128.0
    assert plan.limit == 2 * BATCH + 7 * BATCH
    more = _feed(plan, [2.0 + 0.5 * k for k in range(7)])
    assert more == [True] * 6 + [False]  # stops at the planned count, within the budget
    assert plan.read == 9 * BATCH
    assert plan.cut
    fields = plan.fields()
    assert fields["budget_cut"] is True
    assert fields["budget_rate"] == 128.0
    assert fields["planned"] == 9 * BATCH
    assert fields["unread"] == 10_000 - 9 * BATCH
    assert fields["budget_s"] == 5.0
    assert "128.0 images/s" in fields["reason"]
    assert f"fit {9 * BATCH} of the 10000 images" in fields["reason"]


def test_plan_reads_its_minimum_batches_whatever_the_budget() -> None:
    plan = ReadPlan(ReaderBudget(0.0, min_batches=3), total=10_000, start=0.0)
    assert _feed(plan, [4.0, 8.0, 12.0]) == [True, True, False]  # three batches, then nothing fits
    assert plan.read == 3 * BATCH
    assert plan.cut
    assert plan.fields()["planned"] == 3 * BATCH


def test_plan_that_reads_everything_is_not_cut() -> None:
    plan = ReadPlan(ReaderBudget(5.0, min_batches=2), total=150, start=0.0)
    assert _feed(plan, [0.1, 0.2]) == [True, True]
    assert plan.more(22, now=0.3) is False  # the sample's end: every image read
    assert not plan.cut
    assert plan.fields() | {"budget_rate": 0} == {
        "budget_s": 5.0,
        "budget_rate": 0,
        "budget_cut": False,
        "planned": 150,
        "unread": 0,
        "reason": "",
    }


def test_plan_stops_when_its_budget_runs_out_before_the_planned_count() -> None:
    plan = ReadPlan(ReaderBudget(2.0, min_batches=2), total=10_000, start=0.0)
    assert _feed(plan, [0.1, 0.2]) == [True, True]  # 640 images/s: 1.8 s fit 1,152 more
    assert plan.limit == 2 * BATCH + 18 * BATCH
    assert _feed(plan, [1.0, 2.5]) == [True, False]  # then the server slowed down: out of time
    assert plan.cut
    assert plan.out_of_time
    assert plan.fields()["planned"] == 4 * BATCH
    assert "ran out" in plan.reason()


def test_no_budget_reads_the_whole_sample() -> None:
    plan = ReadPlan(None, total=200, start=0.0)
    assert _feed(plan, [100.0, 200.0, 300.0]) == [True, True, True]
    assert plan.more(8, now=400.0) is False
    assert not plan.cut
    assert plan.fields()["budget_s"] == 0.0
    assert plan.fields()["reason"] == ""


def test_clock_shares_what_is_left_between_the_readers_still_to_run() -> None:
    clock = CheckClock(10.0, min_batches=2, start=0.0)  # 8 s for readers, 2 s kept for the report and the exit
    clock.expect(4)
    first = clock.next(now=0.0)
    assert first == ReaderBudget(2.0, 2)
    assert clock.next(now=5.0) == ReaderBudget(1.0, 2)  # the first ran long: the others share the rest
    assert clock.next(now=6.0) == ReaderBudget(1.0, 2)
    assert clock.next(now=7.5) == ReaderBudget(0.5, 2)
    clock.expect(1)
    assert clock.next(now=12.0) == ReaderBudget(0.0, 2)  # past the deadline: the minimum batches only
    assert CheckClock(0.0).next() is None  # no budget


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
def test_a_cut_reader_verifies_every_image_it_read(bad: bool) -> None:
    rs, images = _read_set(100)
    if bad:
        images[3] = images[4]  # a wrong byte in what the reader does read still fails it
    closed: list[bool] = []
    spec = PipelineSpec(batch_size=8, num_threads=1, mode="raw")
    batches = _batches(rs, images, 8, closed)
    result = run_external("cassandra", rs, spec, batches, {}, budget=ReaderBudget(0.0, min_batches=2))
    assert result.images == 16  # its two minimum batches, then its budget was spent
    assert result.budget_cut
    assert result.unread == 84
    assert result.planned == 16
    assert result.reason.startswith("its 0.0 s budget")
    assert closed == [True]  # the reader behind the batches was stopped
    if bad:
        assert not result.ok
        assert any(p.startswith("id-0003: sha256") for p in result.problems)
    else:
        assert result.ok, result.problems
        assert result.images_verified == result.images  # every image read, checked; the unread not missing
        assert result.problems == []


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
