"""A reader whose whole sample takes less than its least window reads it again.

The check's sample is 10,000 images; imgest's Cassandra reader reads them in 0.7-1.0 s raw and the S3 stream reader
in 0.4 s, under the least window their rates need to settle (``defaults.CHECK_LEAST_WINDOW_S``: 1 s and 0.5 s).
A rate over one such read is the node's noise: at 143 k images the Cassandra reader's full reads of one sample spread
9,416-14,792 images/s over four rounds. So, as a training loop does, the reader reads its sample again (an epoch
more, through the same reader: Cassandra's window and the stream's connections carry over), and its rate is the
steady part of every pass (each pass's warm-up left out) over the seconds they span, until those span the window.

- In the DAG's check (a budget) a pass starts only where it would end before the check's deadline; where none could,
  the one read is not a steady rate and says why. Without a budget, only where asked (``settle``: the fidelity
  benchmark's full read, so that what the check is compared with spans the same window).
- At most MAX_PASSES: a sample so small that its read spans less than a MAX_PASSES-th of the window (a test's
  26 images) is not read again; its one read is the rate of the whole sample, as before.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from imgest.readback.budget import SAMPLE_READ, ReaderBudget, least_window
from imgest.readback.measure import RunResult

MAX_PASSES = 4


def read_passes(
    name: str, mode: str, budget: ReaderBudget | None, settle: bool, read_pass: Callable[[], RunResult]
) -> RunResult:
    """READ_PASS (one read of the sample by reader NAME in MODE, within BUDGET) as often as its least window needs
    (see the module); one result over every pass. Without BUDGET and SETTLE: one pass, as it is."""
    first = read_pass()
    if budget is None and not settle:
        return first
    least = least_window(name, mode)
    runs = [first]
    while _wants_another(runs, least) and _fits(runs[-1], budget):
        runs.append(read_pass())
    return merged(runs, least, budget is not None)


def _wants_another(runs: list[RunResult], least: float) -> bool:
    """Whether the passes so far read their whole sample each, verified, and span less than LEAST, and the first
    spans enough of it that MAX_PASSES would reach it."""
    last, span = runs[-1], sum(r.steady_s for r in runs)
    if last.stop != SAMPLE_READ or not all(r.ok for r in runs) or span >= least or len(runs) >= MAX_PASSES:
        return False
    return runs[0].steady_s * MAX_PASSES >= least


def _fits(last: RunResult, budget: ReaderBudget | None) -> bool:
    """Whether another pass as long as LAST (its start-up and its teardown included) ends before BUDGET's deadline."""
    if budget is None or budget.deadline is None:
        return True
    needs = last.seconds + last.startup_s + max(budget.after, last.teardown_s)
    return time.perf_counter() + needs < budget.deadline


def merged(runs: list[RunResult], least: float, check: bool) -> RunResult:
    """One result over RUNS, passes over one sample by one reader: what it read in all, its start-up the first
    pass's, its steady rate the steady part of every pass over the seconds they span (steady where those reach
    LEAST); batch times laid end to end (each pass's own, from its epoch loop's start). CHECK: a budget's (a short
    single read is then no rate)."""
    first, last = runs[0], runs[-1]
    out = RunResult(first.reader, first.mode, first.device, settings={**first.settings, "passes": len(runs)})
    for attr in ("first_batch_ms", "startup_s", "warmup_s", "warmup_batches", "budget_s", "note"):
        setattr(out, attr, getattr(first, attr))
    out.teardown_s, out.second_half_rate = last.teardown_s, last.second_half_rate
    if len(runs) == 1:  # one pass: cut or not, as it was (after more than one, the sample was read in full)
        out.budget_cut, out.unread, out.reason = first.budget_cut, first.unread, first.reason
    out.images, out.bytes = sum(r.images for r in runs), sum(r.bytes for r in runs)
    out.steady_batches, out.steady_images = sum(r.steady_batches for r in runs), sum(r.steady_images for r in runs)
    out.seconds, out.steady_s = round(sum(r.seconds for r in runs), 3), round(sum(r.steady_s for r in runs), 3)
    out.passes, out.least_window_s = len(runs), least
    out.images_verified = max(r.images_verified for r in runs)
    out.steady_rate = round(out.steady_images / out.steady_s, 1) if out.steady_s > 0 else 0.0
    out.images_per_s = round(out.images / out.seconds, 1) if out.seconds else 0.0
    out.mb_per_s = round(out.bytes / 1e6 / out.seconds, 2) if out.seconds else 0.0
    counts = [len(r.batch_images) or 1 for r in runs]  # the harmonic mean of every batch's rate, over the passes
    if all(r.epoch_rate > 0 for r in runs):
        out.epoch_rate = round(sum(counts) / sum(k / r.epoch_rate for k, r in zip(counts, runs, strict=True)), 1)
    out.batch_ms_p50 = round(statistics.median(r.batch_ms_p50 for r in runs), 2)
    out.batch_ms_p99 = max(r.batch_ms_p99 for r in runs)
    out.cpu_cores = round(sum(r.cpu_cores * r.seconds for r in runs) / out.seconds, 2) if out.seconds else 0.0
    out.cores_per_1k = round(out.cpu_cores / (out.epoch_rate / 1000), 3) if out.epoch_rate else 0.0
    offset = 0.0
    for r in runs:
        out.batch_ends += [round(offset + e, 5) for e in r.batch_ends]
        out.batch_images += r.batch_images
        offset += r.seconds
    if len(runs) == 1:
        out.problems = list(first.problems)
    else:  # each problem says in which pass
        out.problems = [f"pass {k + 1}: {p}" for k, r in enumerate(runs) for p in r.problems]
    out.ok = all(r.ok for r in runs)
    out.stop = first.stop if len(runs) == 1 else f"{SAMPLE_READ} {len(runs)} times"
    if len(runs) > 1 and last.stop != SAMPLE_READ:
        out.stop += f" (the last pass stopped: {last.stop})"
    _steadiness(out, runs, least, check)
    return out


def _steadiness(out: RunResult, runs: list[RunResult], least: float, check: bool) -> None:
    """Whether OUT's rate is a throughput: its first pass read its window of batches and every pass's measured
    batches together span LEAST; a budget's single short read is none (its deadline let no second pass start); a
    read no pass could lengthen (a tiny sample, or no budget and nothing asked) stays its pass's."""
    if len(runs) == 1 and not (check and runs[0].steady and runs[0].steady_s < least and _short(runs[0], least)):
        out.steady, out.rate_note = runs[0].steady, runs[0].rate_note
        return
    out.steady = runs[0].steady and out.steady_s >= least
    if out.steady:
        out.rate_note = ""
        return
    passes = f"its {len(runs)} reads of its whole sample" if len(runs) > 1 else "its read of its whole sample"
    out.rate_note = (
        f"not a steady rate: {passes} span {out.steady_s:.2f} s of measured batches, less than the {least:.2f} s "
        "this reader's rate needs to settle (the check's deadline left no time for another pass)"
    )


def _short(run: RunResult, least: float) -> bool:
    """Whether RUN read its whole sample in less than LEAST, and enough of it that passes would have reached it."""
    return run.stop == SAMPLE_READ and run.steady_s * MAX_PASSES >= least
