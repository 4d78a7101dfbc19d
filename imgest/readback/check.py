"""The read-throughput check: every reader that applies to a stored dataset, each mode, one report.

The ``*_runs`` functions run the readers of one target (Cassandra tables, shards in a folder or on S3 (check_s3), files)
over the same ReadSet (a sample of the split, or all of it) and return a report: per reader and mode images/s,
MB/s, p50/p99 batch latency, CPU cores used, and whether every sample hashed to its recorded sha256 with its
label, exactly once. Given a CheckClock (the DAG's check) each reader reads within its share of the check's time
budget (imgest.readback.budget), and says so when that cut it short. The benchmark (``imgest bench read``) adds the
latency sweep and the plots.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from imgest.core import defaults
from imgest.core.settings import CassandraSettings
from imgest.readback.budget import (
    READER_STARTUP_S,
    CheckClock,
    ReaderBudget,
    check_seconds,
    expect,
    least_window,
    next_budget,
    spent_before,
)
from imgest.readback.cassandra import CassandraReader, CassandraReadOptions, epoch_order
from imgest.readback.cassandra_base import simple_batches
from imgest.readback.datasets import ReadSet
from imgest.readback.measure import RunResult
from imgest.readback.passes import read_passes
from imgest.readback.pipelines import PipelineSpec
from imgest.readback.readers import run_external, run_files, run_webdataset
from imgest.readback.s3shards import S3StreamOptions
from imgest.readback.skips import not_run

log = logging.getLogger(__name__)
Progress = Callable[[int], None] | None


@dataclass(frozen=True)
class ReadCheckOptions:
    """What every reader of one check shares, and how much of the split it reads: a seeded class-balanced sample
    of ``sample`` train images (whole shards for shards), every row when ``sample`` is 0; in the step, within
    ``seconds`` in all (0: no budget; in a run of ``run_seconds`` before the check, of 100,000 images or more, a
    share of it: :meth:`budget_for`), each reader its ``warmup`` and ``window`` batches at least
    (imgest.readback.budget)."""

    sample: int = defaults.CHECK_SAMPLE
    sample_seed: int = defaults.CHECK_SAMPLE_SEED
    seconds: float = defaults.CHECK_SECONDS
    warmup: int = defaults.CHECK_WARMUP_BATCHES
    window: int = defaults.CHECK_WINDOW_BATCHES
    run_seconds: float | None = None  # the run's time before the check (None: not in a run)
    spent: float = 0.0  # what the check's task had run before the check (its start, its imports)
    batch_size: int = 64
    modes: tuple[str, ...] = ("raw", "train")
    num_threads: int = 2
    device_id: int | None = None
    cassandra: CassandraReadOptions = field(default_factory=CassandraReadOptions)
    s3: S3StreamOptions = field(default_factory=S3StreamOptions)
    # without a budget, a reader whose sample ends before its least window reads it again all the same (a budget
    # always does: imgest.readback.passes); the fidelity benchmark's full read, compared with the check's
    settle: bool = False
    dali_s3: bool = True  # DALI's own s3:// reader too, where the shards are on S3

    def spec(self, mode: str) -> PipelineSpec:
        return PipelineSpec(self.batch_size, self.num_threads, mode, self.device_id)

    def clock(self) -> CheckClock:
        """The check's budget, from now, to hand to its readers (its seconds set by :meth:`budget_for` once the
        sample's count is known)."""
        return CheckClock(self.seconds, self.warmup, self.window)

    def budget_for(self, images: int) -> float:
        """The check's budget for a version of IMAGES train images (imgest.readback.budget.check_seconds)."""
        return check_seconds(self.seconds, self.run_seconds, images, spent=self.spent)


def cassandra_run(
    settings: CassandraSettings,
    rs: ReadSet,
    spec: PipelineSpec,
    copts: CassandraReadOptions,
    progress: Progress = None,
    budget: ReaderBudget | None = None,
    settle: bool = False,
) -> RunResult:
    """imgest's Cassandra reader, in ReadSet order (seed None), feeding fn.external_source: one epoch, read again
    (through the same reader: its window carries over) where it ends before its least window, within BUDGET or as
    SETTLE asks (imgest.readback.passes)."""
    copts = replace(copts, batch_size=spec.batch_size, seed=None)
    started = time.perf_counter()  # the first pass's start-up includes the reader's connection
    with CassandraReader(settings, rs.table, rs.ids, rs.labels, copts) as reader:
        order = epoch_order(rs.ids, rs.labels, copts, 0)  # each pass by its order: nothing requested past it
        read = _epoch_reads(reader, rs, spec, copts, progress, budget, started)
        return read_passes("cassandra", spec.mode, budget, settle, lambda: read(order))


def _epoch_reads(
    reader: CassandraReader,
    rs: ReadSet,
    spec: PipelineSpec,
    copts: CassandraReadOptions,
    progress: Progress,
    budget: ReaderBudget | None,
    started: float,
) -> Callable[[Any], RunResult]:
    """Each call (with an epoch's ORDER, or None: the reader's next, the one after it requested ahead) one epoch of
    READER through its own pipeline, verified, within BUDGET, recording the reader's window; the first epoch's
    start-up counts from STARTED (its connection), each next one's from the end of the one before."""
    names = ("prefetch_buffers", "slow_start", "max_window_mb", "requests_in_flight", "rows_per_request", "io_threads")
    knobs: dict[str, Any] = {k: getattr(copts, k) for k in (*names, "ooo", "prefetch_next_epoch")}

    def one_epoch(order: Any) -> RunResult:
        nonlocal started
        batches = ((i, lab, ids, [None] * len(ids)) for i, lab, ids in reader.epoch_batches(order=order))
        result = run_external(
            "cassandra", rs, spec, batches, dict(knobs), on_batch=progress, budget=budget, started=started
        )
        started = time.perf_counter()
        if reader.window_stats is not None:
            result.settings["window"] = reader.window_stats.to_dict()
        result.settings["connections"] = reader.connections
        result.settings["started_ahead"] = reader.started_ahead  # rows requested before the epoch was asked for
        return result

    return one_epoch


def cassandra_epochs(
    settings: CassandraSettings,
    rs: ReadSet,
    spec: PipelineSpec,
    copts: CassandraReadOptions,
    epochs: int,
    progress: Progress = None,
    budget: ReaderBudget | None = None,
) -> list[RunResult]:
    """EPOCHS epochs of one Cassandra reader (its window carries over from one epoch to the next, as in training),
    each through its own pipeline and verified (within BUDGET each); each result records the window it used."""
    copts = replace(copts, batch_size=spec.batch_size, seed=None)
    started = time.perf_counter()  # the first epoch's start-up includes the reader's connection
    with CassandraReader(settings, rs.table, rs.ids, rs.labels, copts) as reader:
        read = _epoch_reads(reader, rs, spec, copts, progress, budget, started)
        # the last epoch by its order, so that nothing of an epoch no one reads is requested while it drains
        last = epoch_order(rs.ids, rs.labels, copts, epochs - 1)
        return [read(last if k == epochs - 1 else None) for k in range(epochs)]


def cassandra_simple_run(
    settings: CassandraSettings,
    rs: ReadSet,
    spec: PipelineSpec,
    progress: Progress = None,
    budget: ReaderBudget | None = None,
    settle: bool = False,
) -> RunResult:
    """The straightforward reader: one execute_concurrent_with_args per batch, nothing ahead (its sample read again
    where it ends before its least window: imgest.readback.passes)."""
    from imgest.sinks.cassandra.client import cassandra_session

    started = time.perf_counter()
    with cassandra_session(settings) as session:

        def one_pass() -> RunResult:
            nonlocal started
            plain = simple_batches(session, rs.table, rs.ids, spec.batch_size)
            batches = ((i, lab, ids, [None] * len(ids)) for i, lab, ids in plain)
            knobs = {"reader": "execute_concurrent_with_args per batch, no prefetch"}
            result = run_external(
                "cassandra-simple", rs, spec, batches, knobs, on_batch=progress, budget=budget, started=started
            )
            started = time.perf_counter()
            return result

        return read_passes("cassandra-simple", spec.mode, budget, settle, one_pass)


def starts(name: str, mode: str, budget: ReaderBudget | None, clock: CheckClock | None, skipped: list[str]) -> bool:
    """Whether reader NAME in MODE starts on BUDGET: not where what is left before the check's deadline would not
    cover its start-up (READER_STARTUP_S) and its least window (budget.least_window), which it reads whatever its
    share; then its line goes to SKIPPED (and the log), and the time goes to the readers after it."""
    if not spent_before(budget, startup=READER_STARTUP_S + least_window(name, mode)):
        return True
    line = not_run(name, mode, clock)
    log.warning("%s", line)
    skipped.append(line)
    return False


def cassandra_runs(
    settings: CassandraSettings,
    rs: ReadSet,
    opts: ReadCheckOptions,
    baseline: bool = True,
    progress: Progress = None,
    clock: CheckClock | None = None,
    skipped: list[str] | None = None,
) -> list[RunResult]:
    """imgest's Cassandra reader (and the straightforward one) in each mode, each within its share of CLOCK; a
    reader whose turn comes with too little left for a measurement (:func:`starts`) is not run: a line in SKIPPED
    (and the log)."""
    results: list[RunResult] = []
    skipped = [] if skipped is None else skipped
    expect(clock, len(opts.modes) * (2 if baseline else 1))
    for mode in opts.modes:
        spec = opts.spec(mode)
        for name in ("cassandra", "cassandra-simple")[: 2 if baseline else 1]:
            budget = next_budget(clock)
            if not starts(name, mode, budget, clock, skipped):
                continue
            if name == "cassandra":
                results.append(cassandra_run(settings, rs, spec, opts.cassandra, progress, budget, opts.settle))
            else:
                results.append(cassandra_simple_run(settings, rs, spec, progress, budget, opts.settle))
    return results


def files_runs(
    rs: ReadSet, opts: ReadCheckOptions, progress: Progress = None, clock: CheckClock | None = None
) -> list[RunResult]:
    """fn.readers.file over the files target in each mode, each within its share of CLOCK."""
    expect(clock, len(opts.modes))
    results = []
    for mode in opts.modes:
        budget = next_budget(clock)
        read = partial(run_files, rs, opts.spec(mode), on_batch=progress, budget=budget)
        results.append(read_passes("files", mode, budget, opts.settle, read))
    return results


def folder_shard_runs(
    rs: ReadSet, root: str, opts: ReadCheckOptions, progress: Progress = None, clock: CheckClock | None = None
) -> list[RunResult]:
    """fn.readers.webdataset over shards in a folder (with their .idx), in each mode, each within its share of
    CLOCK."""
    expect(clock, len(opts.modes))
    results = []
    for mode in opts.modes:
        budget = next_budget(clock)
        read = partial(run_webdataset, "shards-folder", rs, opts.spec(mode), root, on_batch=progress, budget=budget)
        results.append(read_passes("shards-folder", mode, budget, opts.settle, read))
    return results
