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
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from imgest.core import defaults
from imgest.core.settings import CassandraSettings, S3Settings
from imgest.readback.budget import (
    CheckClock,
    ReaderBudget,
    check_seconds,
    expect,
    next_budget,
    not_run,
    spent_before,
)
from imgest.readback.cassandra import CassandraReader, CassandraReadOptions, epoch_order
from imgest.readback.cassandra_base import simple_batches
from imgest.readback.datasets import ReadSet
from imgest.readback.measure import RunResult
from imgest.readback.pipelines import PipelineSpec
from imgest.readback.readers import run_external, run_files, run_webdataset, s3_stream_batches, webdataset_batches
from imgest.readback.s3shards import S3ShardStream, S3StreamOptions

log = logging.getLogger(__name__)
Progress = Callable[[int], None] | None
DALI_S3_NOTE = (
    "DALI's s3:// reader does one blocking ranged GET per sample component (.jpg, .cls, .json), one after another "
    "from its loader thread, so one pipeline reads at the server's request rate / 3; the check runs several in "
    "parallel over 64-sample blocks of the shards in a random order, as its rate varies with the place it reads "
    "(the embedded SeaweedFS inflates a whole gzipped 4 MiB chunk per read: up to 13x slower there) "
    "(NVIDIA/DALI #5551; docs/readback.md)"
)


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


def cassandra_runs(
    settings: CassandraSettings,
    rs: ReadSet,
    opts: ReadCheckOptions,
    baseline: bool = True,
    progress: Progress = None,
    clock: CheckClock | None = None,
) -> list[RunResult]:
    """imgest's Cassandra reader (and the straightforward one) in each mode, each within its share of CLOCK."""
    results = []
    expect(clock, len(opts.modes) * (2 if baseline else 1))
    for mode in opts.modes:
        spec = opts.spec(mode)
        results.append(cassandra_run(settings, rs, spec, opts.cassandra, progress, next_budget(clock)))
        if baseline:
            results.append(cassandra_simple_run(settings, rs, spec, progress, next_budget(clock)))
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


@contextmanager
def dali_s3_env(settings: S3Settings) -> Iterator[None]:
    """The AWS SDK inside DALI reads its endpoint and keys from the environment: set them for one run.

    DALI builds one S3 client per process, from ``AWS_ENDPOINT_URL`` alone, on its first ``s3://`` read: later
    changes of the endpoint in the same process are ignored, and no connection or transfer setting is read.
    ``fn.readers.webdataset`` then issues one ranged GET per sample member, one after the other from its loader
    thread, which bounds it at the server's request rate / members per sample (docs/readback.md)."""
    # the keys of this moment (temporary ones renewed when near expiry), not those the settings were shipped with
    now = settings.credentials().get_frozen_credentials() if settings.access_key else None
    keys = {
        "AWS_ENDPOINT_URL": settings.endpoint_url or "",
        "AWS_ACCESS_KEY_ID": now.access_key if now else "",
        "AWS_SECRET_ACCESS_KEY": now.secret_key if now else "",
        "AWS_SESSION_TOKEN": (now.token or "") if now else "",
        "AWS_REGION": settings.region,
        "AWS_DEFAULT_REGION": settings.region,
        "AWS_S3_ADDRESSING_STYLE": "path",
    }
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: v for k, v in keys.items() if v})
    for name in (k for k, v in keys.items() if not v):  # nothing of another identity pairs with these keys
        os.environ.pop(name, None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


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


def s3_dali_run(rs: ReadSet, settings: S3Settings, location: str, spec: PipelineSpec, **kw: Any) -> RunResult:
    """DALI's own s3:// reading of the shards at LOCATION (fn.readers.webdataset, each shard's .idx split into blocks
    of CHECK_DALI_S3_BLOCK samples read in a seeded random order: imgest.readback.blocks), CHECK_DALI_S3_READERS
    pipelines in parallel, each over its part of the blocks (one pipeline reads one blocking request after another),
    its rate and the reason it is slow in its result (``note``) and in the log. Its batches hold at most
    CHECK_DALI_S3_BATCH images per pipeline."""
    import tempfile

    from imgest.core.bucket_region import for_bucket
    from imgest.readback.blocks import block_lists, index_reader
    from imgest.readback.readers import shard_indexes
    from imgest.sinks.shards.store import open_store

    spec = replace(spec, batch_size=min(spec.batch_size, defaults.CHECK_DALI_S3_BATCH))
    settings = for_bucket(settings, location.removeprefix("s3://").split("/", 1)[0])  # its SDK never follows
    store = open_store(location, settings)
    kw.setdefault("started", time.perf_counter())  # reading the indexes is part of its start-up
    with tempfile.TemporaryDirectory(prefix="imgest-dali-blocks-") as folder, dali_s3_env(settings):
        block = defaults.CHECK_DALI_S3_BLOCK
        lists = block_lists(index_reader(store), location, rs.shards, shard_indexes(rs), Path(folder), block)
        readers = defaults.CHECK_DALI_S3_READERS
        result = run_webdataset("shards-s3-dali", rs, spec, location, readers=readers, lists=lists, **kw)
    result.settings |= {"order": f"blocks of {block} samples, seeded random order", "blocks": len(lists[0])}
    result.note = DALI_S3_NOTE
    if result.budget_cut:
        result.reason = f"{result.reason}; {DALI_S3_NOTE}"
    rate = f"{result.steady_rate:.1f} images/s steady" if result.steady else "no steady rate (start-up only)"
    log.warning(
        "shards-s3-dali (%s): %s, start-up %.1f s, %d of %d images read and verified in %.1f s (budget %.1f s%s): %s",
        spec.mode,
        rate,
        result.startup_s,
        result.images,
        len(rs),
        result.seconds,
        result.budget_s,
        ", cut" if result.budget_cut else "",
        DALI_S3_NOTE,
    )
    return result


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
    expect(clock, 2 * len(opts.modes))
    expect(clock, len(opts.modes), reserve=defaults.CHECK_DALI_S3_RESERVE_S)  # DALI last, not starved
    importing = import_ahead("webdataset")  # 3 s of imports (torch): done while the stream reader reads
    for mode in opts.modes:
        spec = opts.spec(mode)
        sopts = replace(opts.s3, shuffle_buffer=0)
        results.append(s3_stream_run(rs, settings, bucket, prefix, spec, sopts, progress, next_budget(clock)))
        budget = next_budget(clock)
        if spent_before(budget):  # its torch import alone takes seconds
            skipped.append(not_run("shards-s3-webdataset", mode, clock))
            continue
        results.append(s3_webdataset_run(rs, settings, bucket, prefix, spec, progress, budget))
    for mode in opts.modes:  # last, over what the others left: its rate varies with the place, it reads its share
        spec = opts.spec(mode)
        budget = next_budget(clock, stop_when_steady=False, reserve=defaults.CHECK_DALI_S3_RESERVE_S)
        if spent_before(budget, startup=defaults.CHECK_DALI_S3_STARTUP_S):  # its pipelines' build takes seconds
            skipped.append(not_run("shards-s3-dali", mode, clock))
            continue
        try:
            where = f"s3://{bucket}/{prefix}"
            results.append(s3_dali_run(rs, settings, where, spec, on_batch=progress, budget=budget))
        except Exception as exc:  # DALI raises RuntimeError subclasses from its C++ readers: record why, go on
            skipped.append(f"shards-s3-dali ({mode}): {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    importing.join()  # nothing of the check goes on running after it (the webdataset reader waited for it anyway)
    return results, skipped
