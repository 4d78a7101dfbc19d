"""The read-throughput check's readers of shards on S3: imgest's streaming reader, webdataset.WebDataset, then
DALI's own s3:// reader (imgest.readback.dali_s3) over the time they left (imgest.readback.check: the others)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from imgest.core import defaults
from imgest.core.settings import S3Settings
from imgest.readback.budget import CheckClock, ReaderBudget, affords, expect, next_budget
from imgest.readback.check import Progress, ReadCheckOptions, starts
from imgest.readback.dali_s3 import dali_s3_runs
from imgest.readback.datasets import ReadSet
from imgest.readback.measure import RunResult
from imgest.readback.passes import read_passes
from imgest.readback.pipelines import PipelineSpec
from imgest.readback.readers import run_external, s3_stream_batches, webdataset_batches
from imgest.readback.s3shards import S3ShardStream, S3StreamOptions
from imgest.readback.skips import not_kept


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
    settle: bool = False,
) -> RunResult:
    """imgest's streaming shard reader (whole-shard GETs in parallel) feeding fn.external_source: one epoch, read
    again (its connections and window carry over) where it ends before its least window (imgest.readback.passes)."""
    read = _stream_reads(rs, settings, bucket, prefix, spec, sopts, progress, budget)
    return read_passes("shards-s3-stream", spec.mode, budget, settle, read)


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
    read = _stream_reads(rs, settings, bucket, prefix, spec, sopts, progress, budget)
    return [read() for _ in range(epochs)]


def _stream_reads(
    rs: ReadSet,
    settings: S3Settings,
    bucket: str,
    prefix: str,
    spec: PipelineSpec,
    sopts: S3StreamOptions,
    progress: Progress,
    budget: ReaderBudget | None,
) -> Callable[[], RunResult]:
    """Each call one epoch of RS through one streaming shard reader (opened now: the first epoch's start-up
    counts its opening), verified, within BUDGET, recording the window it used."""
    sopts, started = replace(sopts, batch_size=spec.batch_size), time.perf_counter()
    dead = {f"{prefix}/{s}" if prefix else s: keys for s, keys in rs.dead.items()}
    stream = S3ShardStream(settings, bucket, s3_keys(rs, prefix), sopts, dead)
    names = ("parallel_shards", "slow_start", "io_threads", "max_buffer_mb", "shuffle_buffer")
    knobs: dict[str, Any] = {k: getattr(sopts, k) for k in names}

    def one_epoch() -> RunResult:
        nonlocal started
        batches = s3_stream_batches(stream)
        result = run_external(
            "shards-s3-stream", rs, spec, batches, dict(knobs), on_batch=progress, budget=budget, started=started
        )
        started = time.perf_counter()
        if stream.window_stats is not None:
            result.settings["window"] = stream.window_stats.to_dict()
        return result

    return one_epoch


def s3_webdataset_run(
    rs: ReadSet,
    settings: S3Settings,
    bucket: str,
    prefix: str,
    spec: PipelineSpec,
    progress: Progress = None,
    budget: ReaderBudget | None = None,
    settle: bool = False,
) -> RunResult:
    """webdataset.WebDataset streaming the same objects (one GET per shard, boto3 streaming body); its sample read
    again where it ends before its least window (imgest.readback.passes)."""
    client = settings.client()

    def opener(url: str) -> Any:
        return client.get_object(Bucket=bucket, Key=url[len(f"s3://{bucket}/") :])["Body"]

    urls = [f"s3://{bucket}/{k}" for k in s3_keys(rs, prefix)]
    dead = {f"s3://{bucket}/{prefix}/{s}" if prefix else f"s3://{bucket}/{s}": keys for s, keys in rs.dead.items()}
    knobs = {"reader": "webdataset.WebDataset"}

    def one_pass() -> RunResult:
        started = time.perf_counter()
        peer = webdataset_batches(urls, spec.batch_size, opener, dead)
        return run_external(
            "shards-s3-webdataset", rs, spec, peer, dict(knobs), on_batch=progress, budget=budget, started=started
        )

    return read_passes("shards-s3-webdataset", spec.mode, budget, settle, one_pass)


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
    turns = affords(clock, len(opts.modes), reserve, before=2 * len(opts.modes)) if opts.dali_s3 else 0
    expect(clock, 2 * len(opts.modes))
    expect(clock, turns, reserve=reserve)  # DALI last, not starved
    importing = import_ahead("webdataset")  # 3 s of imports (torch): done while the stream reader reads
    for mode in opts.modes:
        spec = opts.spec(mode)
        sopts = replace(opts.s3, shuffle_buffer=0)
        budget = next_budget(clock)
        if starts("shards-s3-stream", mode, budget, clock, skipped):
            results.append(s3_stream_run(rs, settings, bucket, prefix, spec, sopts, progress, budget, opts.settle))
        budget = next_budget(clock)
        if starts("shards-s3-webdataset", mode, budget, clock, skipped):  # its torch import: done ahead
            results.append(s3_webdataset_run(rs, settings, bucket, prefix, spec, progress, budget, opts.settle))
    modes = [(mode, opts.spec(mode)) for mode in opts.modes[:turns]]  # last, over what the others left (dali_s3)
    dali, failed = dali_s3_runs(rs, settings, f"s3://{bucket}/{prefix}", modes, progress, clock)
    if opts.dali_s3:  # a reserve that bought no turn says so
        skipped += [not_kept("shards-s3-dali", mode, clock, reserve) for mode in opts.modes[turns:]]
    results += dali
    skipped += failed
    importing.join()  # nothing of the check goes on running after it (the webdataset reader waited for it anyway)
    return results, skipped
