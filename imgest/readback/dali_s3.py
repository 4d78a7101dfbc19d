"""DALI's own ``s3://`` reader in the read-back check: its runs, and the time its turns need.

DALI's ``fn.readers.webdataset`` over ``s3://`` URLs reads one blocking ranged GET per sample component from its
loader thread; the check runs CHECK_DALI_S3_READERS of its pipelines at once over the shards' blocks in a seeded
random order (imgest.readback.blocks, imgest.readback.parallel). It reads last, one turn per mode, in a process of its
own (imgest.readback.dali_s3_process): a pipeline's deletion waits for the batch its loader prefetches (1.3 s quiet,
13.3 s measured with the server busy), so the turn's process sends its result and exits without it, and the check
kills it at its deadline if it still reads then. A turn costs more than its reads: its process's start, its
pipelines' build and first batch (its start-up), and its process's end (its teardown). A turn starts only when what is
left before the check's deadline covers both (its start-up with a margin: STARTUP_MARGIN), and stops reading where
another batch, and DRAIN_BATCHES more of its time, would not end before the deadline: the defaults
(CHECK_DALI_S3_STARTUP_S, CHECK_DALI_S3_TEARDOWN_S) until a turn of this check measured them, then that turn's figures
(:class:`TurnCost`): on a busy machine a first batch takes 5-11 s, not 2.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from imgest.core import defaults
from imgest.core.settings import S3Settings
from imgest.readback.budget import CheckClock, ReaderBudget, least_window, next_budget, spent_before
from imgest.readback.dali_s3_process import TurnKilled, run_apart
from imgest.readback.datasets import ReadSet
from imgest.readback.measure import RunResult
from imgest.readback.pipelines import PipelineSpec
from imgest.readback.skips import not_run

log = logging.getLogger(__name__)

DALI_S3_NOTE = (
    "DALI's s3:// reader does one blocking ranged GET per sample component (.jpg, .cls, .json), one after another "
    "from its loader thread, so one pipeline reads at the server's request rate / 3; the check runs several in "
    "parallel over 64-sample blocks of the shards in a random order, as its rate varies with the place it reads "
    "(the embedded SeaweedFS inflates a whole gzipped 4 MiB chunk per read: up to 13x slower there) "
    "(NVIDIA/DALI #5551; docs/readback.md)"
)


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
        on_batch, budget = kw.pop("on_batch", None), kw.get("budget")
        args = {"name": "shards-s3-dali", "rs": rs, "spec": spec, "base": location, "lists": lists, **kw}
        # this process's settings, not the child's import of them
        args |= {"readers": defaults.CHECK_DALI_S3_READERS, "least": least_window("shards-s3-dali", spec.mode)}
        result = run_apart(args, budget.deadline if budget else None, on_batch)  # the check waits for no teardown
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


# A batch of DALI's s3:// reader takes up to twice the one before it on a busy server (4 pipelines of 16 images a batch,
# 55 k images on the embedded SeaweedFS: 0.43 s quiet, 1.35-1.4 s with both cores or the server busy): a turn stops
# where its next batch, and this many batches' time more, would not end before the deadline (past it the turn's
# process is killed and its reads are lost).
DRAIN_BATCHES = 1.0
# What a turn's start-up may grow by over the last turn's on a machine whose load changes between them (3.8-4.1 s
# measured with both cores busy, 11.2 s with the server busy as above): a second turn starts only where 1.5 times
# the first one's is left.
STARTUP_MARGIN = 1.5


@dataclass
class TurnCost:
    """What a turn of DALI's s3:// reader costs beside its reads: STARTUP (its build and first batch) and TEARDOWN
    (its pipelines' deletion), the defaults until a turn measured them (:meth:`learn`)."""

    startup: float = defaults.CHECK_DALI_S3_STARTUP_S
    teardown: float = defaults.CHECK_DALI_S3_TEARDOWN_S

    def learn(self, result: RunResult) -> None:
        """The figures of the turn that gave RESULT: what the next turn on this machine needs."""
        self.startup, self.teardown = result.startup_s, result.teardown_s

    @property
    def needs(self) -> float:
        """What what is left must cover for a turn to start: its start-up with STARTUP_MARGIN, its teardown."""
        return STARTUP_MARGIN * self.startup + self.teardown

    def fits(self, budget: ReaderBudget | None) -> bool:
        """Whether what BUDGET leaves before its deadline covers a start-up (with its margin) and a teardown."""
        return not spent_before(budget, startup=self.needs)

    def reading(self, budget: ReaderBudget | None) -> ReaderBudget | None:
        """BUDGET less the teardown: its share less it, and its reader stops reading where another batch would leave
        less than the teardown (or DRAIN_BATCHES times its last batch's time, where more) before the deadline, so
        that its pipelines' deletion ends in time."""
        if budget is None or budget.deadline is None:
            return budget
        seconds = max(0.0, budget.seconds - self.teardown)
        return replace(budget, seconds=seconds, after=self.teardown, drain=DRAIN_BATCHES)


def dali_s3_runs(
    rs: ReadSet,
    settings: S3Settings,
    where: str,
    modes: list[tuple[str, PipelineSpec]],
    progress: Callable[[int], None] | None = None,
    clock: CheckClock | None = None,
) -> tuple[list[RunResult], list[str]]:
    """DALI's s3:// reader over the shards at WHERE, a turn per (mode, spec) of MODES, each within its share of CLOCK
    (kept for it: CHECK_DALI_S3_RESERVE_S) and only where what is left covers its start-up and teardown (the
    module); with the results, one line per turn not run or failed (a report records them and goes on)."""
    results: list[RunResult] = []
    skipped: list[str] = []
    cost = TurnCost()
    for mode, spec in modes:
        budget = next_budget(clock, stop_when_steady=False, reserve=defaults.CHECK_DALI_S3_RESERVE_S)
        if not cost.fits(budget):
            need = f"{cost.startup:.1f} s start-up (x{STARTUP_MARGIN:g}) and {cost.teardown:.1f} s teardown"
            skipped.append(f"{not_run('shards-s3-dali', mode, clock)}; it needs {need}")
            continue
        try:
            result = s3_dali_run(rs, settings, where, spec, on_batch=progress, budget=cost.reading(budget))
        except TurnKilled as exc:  # its process was killed at the check's deadline: what it read is not a result
            skipped.append(f"shards-s3-dali ({mode}): {exc}")
            continue
        except Exception as exc:  # DALI raises RuntimeError subclasses from its C++ readers: record why, go on
            skipped.append(f"shards-s3-dali ({mode}): {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
            continue
        cost.learn(result)
        results.append(result)
    return results, skipped
