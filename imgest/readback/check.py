"""The read-throughput check: every reader that applies to a stored dataset, each mode, one report.

The ``*_runs`` functions run the readers of one target (Cassandra tables, shards in a folder or on S3, files)
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
from typing import Any

from imgest.core import defaults
from imgest.core.settings import CassandraSettings, S3Settings
from imgest.readback.budget import (
    READER_STARTUP_S,
    CheckClock,
    ReaderBudget,
    affords,
    check_seconds,
    expect,
    least_window,
    next_budget,
    spent_before,
)
from imgest.readback.cassandra import CassandraReader, CassandraReadOptions, epoch_order
from imgest.readback.cassandra_base import simple_batches
from imgest.readback.dali_s3 import dali_s3_runs
from imgest.readback.datasets import ReadSet
from imgest.readback.measure import RunResult
from imgest.readback.pipelines import PipelineSpec
from imgest.readback.readers import run_external, run_files, run_webdataset, s3_stream_batches, webdataset_batches
from imgest.readback.s3shards import S3ShardStream, S3StreamOptions
from imgest.readback.skips import not_kept, not_run

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
) -> RunResult:
    """imgest's Cassandra reader, in ReadSet order (seed None), feeding fn.external_source: one epoch."""
    return cassandra_epochs(settings, rs, spec, copts, 1, progress, budget)[0]


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
    names = ("prefetch_buffers", "slow_start", "max_window_mb", "requests_in_flight", "rows_per_request", "io_threads")
    knobs: dict[str, Any] = {k: getattr(copts, k) for k in (*names, "ooo", "prefetch_next_epoch")}
    results, started = [], time.perf_counter()  # the first epoch's start-up includes the reader's connection
    with CassandraReader(settings, rs.table, rs.ids, rs.labels, copts) as reader:
        for k in range(epochs):
            # the last epoch by its order, so that nothing of an epoch no one reads is requested while it drains
            last = epoch_order(rs.ids, rs.labels, copts, k) if k == epochs - 1 else None
            batches = ((i, lab, ids, [None] * len(ids)) for i, lab, ids in reader.epoch_batches(order=last))
            result = run_external(
                "cassandra", rs, spec, batches, dict(knobs), on_batch=progress, budget=budget, started=started
            )
            started = time.perf_counter()
            if reader.window_stats is not None:
                result.settings["window"] = reader.window_stats.to_dict()
            result.settings["connections"] = reader.connections
            result.settings["started_ahead"] = reader.started_ahead  # rows requested before the epoch was asked for
            results.append(result)
    return results


def cassandra_simple_run(
    settings: CassandraSettings,
    rs: ReadSet,
    spec: PipelineSpec,
    progress: Progress = None,
    budget: ReaderBudget | None = None,
) -> RunResult:
    """The straightforward reader: one execute_concurrent_with_args per batch, nothing ahead."""
    from imgest.sinks.cassandra.client import cassandra_session

    started = time.perf_counter()
    with cassandra_session(settings) as session:
        plain = simple_batches(session, rs.table, rs.ids, spec.batch_size)
        batches = ((i, lab, ids, [None] * len(ids)) for i, lab, ids in plain)
        knobs = {"reader": "execute_concurrent_with_args per batch, no prefetch"}
        return run_external(
            "cassandra-simple", rs, spec, batches, knobs, on_batch=progress, budget=budget, started=started
        )


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
                results.append(cassandra_run(settings, rs, spec, opts.cassandra, progress, budget))
            else:
                results.append(cassandra_simple_run(settings, rs, spec, progress, budget))
    return results


def files_runs(
    rs: ReadSet, opts: ReadCheckOptions, progress: Progress = None, clock: CheckClock | None = None
) -> list[RunResult]:
    """fn.readers.file over the files target in each mode, each within its share of CLOCK."""
    expect(clock, len(opts.modes))
    return [run_files(rs, opts.spec(m), on_batch=progress, budget=next_budget(clock)) for m in opts.modes]


def folder_shard_runs(
    rs: ReadSet, root: str, opts: ReadCheckOptions, progress: Progress = None, clock: CheckClock | None = None
) -> list[RunResult]:
    """fn.readers.webdataset over shards in a folder (with their .idx), in each mode, each within its share of
    CLOCK."""
    expect(clock, len(opts.modes))
    return [
        run_webdataset("shards-folder", rs, opts.spec(m), root, on_batch=progress, budget=next_budget(clock))
        for m in opts.modes
    ]


def s3_keys(rs: ReadSet, prefix: str) -> list[str]:
    """Object keys of the ReadSet's shards under PREFIX."""
    return [f"{prefix}/{s}" if prefix else s for s in rs.shards]


def s3_stream_run(
    rs: ReadSet,
    settings: S3Settings,
    bucket: str,
    prefix: str,
    spec: PipelineSpec,
    sopts: S3StreamOptions,
    progress: Progress = None,
    budget: ReaderBudget | None = None,
) -> RunResult:
    """imgest's streaming shard reader (whole-shard GETs in parallel) feeding fn.external_source: one epoch."""
    return s3_stream_epochs(rs, settings, bucket, prefix, spec, sopts, 1, progress, budget)[0]


def s3_stream_epochs(
    rs: ReadSet,
    settings: S3Settings,
    bucket: str,
    prefix: str,
    spec: PipelineSpec,
    sopts: S3StreamOptions,
    epochs: int,
    progress: Progress = None,
    budget: ReaderBudget | None = None,
) -> list[RunResult]:
    """EPOCHS epochs of one streaming shard reader (its read-ahead window carries over, as in training), each
    through its own pipeline and verified (within BUDGET each); each result records the window the epoch used."""
    sopts, started = replace(sopts, batch_size=spec.batch_size), time.perf_counter()
    dead = {f"{prefix}/{s}" if prefix else s: keys for s, keys in rs.dead.items()}
    stream = S3ShardStream(settings, bucket, s3_keys(rs, prefix), sopts, dead)
    names = ("parallel_shards", "slow_start", "io_threads", "max_buffer_mb", "shuffle_buffer")
    knobs: dict[str, Any] = {k: getattr(sopts, k) for k in names}
    results = []
    for _ in range(epochs):
        batches = s3_stream_batches(stream)
        result = run_external(
            "shards-s3-stream", rs, spec, batches, dict(knobs), on_batch=progress, budget=budget, started=started
        )
        started = time.perf_counter()
        if stream.window_stats is not None:
            result.settings["window"] = stream.window_stats.to_dict()
        results.append(result)
    return results


def s3_webdataset_run(
    rs: ReadSet,
    settings: S3Settings,
    bucket: str,
    prefix: str,
    spec: PipelineSpec,
    progress: Progress = None,
    budget: ReaderBudget | None = None,
) -> RunResult:
    """webdataset.WebDataset streaming the same objects (one GET per shard, boto3 streaming body)."""
    started = time.perf_counter()
    client = settings.client()

    def opener(url: str) -> Any:
        return client.get_object(Bucket=bucket, Key=url[len(f"s3://{bucket}/") :])["Body"]

    urls = [f"s3://{bucket}/{k}" for k in s3_keys(rs, prefix)]
    dead = {f"s3://{bucket}/{prefix}/{s}" if prefix else f"s3://{bucket}/{s}": keys for s, keys in rs.dead.items()}
    peer = webdataset_batches(urls, spec.batch_size, opener, dead)
    knobs = {"reader": "webdataset.WebDataset"}
    return run_external(
        "shards-s3-webdataset", rs, spec, peer, knobs, on_batch=progress, budget=budget, started=started
    )


def import_ahead(module: str) -> Any:
    """Import MODULE in a background thread (returned, to join): a reader that needs it later waits on Python's
    import lock for what is left instead of paying it all inside its own share of the budget."""
    import contextlib
    import importlib
    import threading

    def load() -> None:
        with contextlib.suppress(ImportError):  # the reader that needs it says so when it runs
            importlib.import_module(module)

    thread = threading.Thread(target=load, name=f"import-{module}", daemon=True)
    thread.start()
    return thread


def s3_shard_runs(
    rs: ReadSet,
    settings: S3Settings,
    bucket: str,
    prefix: str,
    opts: ReadCheckOptions,
    progress: Progress = None,
    clock: CheckClock | None = None,
) -> tuple[list[RunResult], list[str]]:
    """imgest's streaming reader and webdataset.WebDataset, then DALI's own s3:// reading (last, over the time they
    left: its rate varies with where in the shards it reads, so it reads its whole share), each within its share of
    CLOCK; with the results, DALI's failures (one line each): a report records them and goes on, a test asserts
    there are none."""
    results, skipped = [], []
    reserve = defaults.CHECK_DALI_S3_RESERVE_S
    turns = affords(clock, len(opts.modes), reserve, before=2 * len(opts.modes))  # a reserve that buys a turn
    expect(clock, 2 * len(opts.modes))
    expect(clock, turns, reserve=reserve)  # DALI last, not starved
    importing = import_ahead("webdataset")  # 3 s of imports (torch): done while the stream reader reads
    for mode in opts.modes:
        spec = opts.spec(mode)
        sopts = replace(opts.s3, shuffle_buffer=0)
        budget = next_budget(clock)
        if starts("shards-s3-stream", mode, budget, clock, skipped):
            results.append(s3_stream_run(rs, settings, bucket, prefix, spec, sopts, progress, budget))
        budget = next_budget(clock)
        if starts("shards-s3-webdataset", mode, budget, clock, skipped):  # its torch import: done ahead
            results.append(s3_webdataset_run(rs, settings, bucket, prefix, spec, progress, budget))
    modes = [(mode, opts.spec(mode)) for mode in opts.modes[:turns]]  # last, over what the others left (dali_s3)
    dali, failed = dali_s3_runs(rs, settings, f"s3://{bucket}/{prefix}", modes, progress, clock)
    skipped += [not_kept("shards-s3-dali", mode, clock, reserve) for mode in opts.modes[turns:]]
    results += dali
    skipped += failed
    importing.join()  # nothing of the check goes on running after it (the webdataset reader waited for it anyway)
    return results, skipped
