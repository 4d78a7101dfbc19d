"""The read-back check's time budget: how long each reader reads, what its rate was measured over, and why it stopped.

A reader's epoch has two parts. Its **start-up** is the time to its first batch (``startup_s``, its pipeline's build
included) and its first ``warmup`` batches (a pipeline's first ``run()`` fills its prefetch queue, a reader's window
grows). Its **steady rate** is the images of the batches after them over the time they took (``steady_rate``), and
it is a rate only once it spans at least ``window`` batches and the reader's least window in seconds
(``least_window``; or it read its whole sample, which it reads again while its reads span less than that:
imgest.readback.passes): a reader that stopped sooner says so (``rate_note``), and the
report never shows such a figure as its throughput. The window sizes are the benchmark's
(``imgest bench read --check-fidelity``, docs/readback.md "The time budget").

The check has a budget of seconds from its start (choosing the sample included), of which its readers share all but
its tail (``tail_seconds``: kept for the report, the plot and the task's exit). When its turn comes each reader gets
an equal share of the time left over the readers still to run (:class:`CheckClock`), so time one leaves unused goes
to the ones after it. A reader's share counts from its own start: its start-up (a pipeline's build, seconds for
DALI's ``s3://`` reader on a busy machine) is part of it. A reader reads (:class:`ReadPlan`):

- its warm-up and its window (batches and least seconds) whatever its share (a slow reader's bounded sample, and it
  says so), but never past the
  check's deadline less the reserves of the readers after it (then its rate is not steady): a reader that overruns
  its share never eats the start-up and window kept for DALI's ``s3://`` reader, which runs last;
- then on while its share lasts, and stops early once its rate is steady: its measured batches span at least
  ``window_seconds`` (batches of a few milliseconds measure the scheduler, not the reader) and the rate over their
  second half is within ``STEADY_TOLERANCE`` of the first half's (a reader whose rate varies with where in its
  sample it reads, DALI's ``s3://`` reader, reads its whole share instead: a window of it is that place's rate);
- never past the end of its sample (a sample it read in less than its least window it reads again: a pass more,
  imgest.readback.passes, where one fits before the check's deadline).

Every image it reads is verified as before; the images of the sample it did not read are counted (``unread``), not
reported as missing; its result says why it stopped (``stop``, and ``reason`` when it did before the sample's end).
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, replace
from typing import Any

from imgest.core import defaults

# Kept of the check's budget for what follows its readers: the report, the plot, recording the check and the task's
# exit (torch's and DALI's teardown: 1.6-2 s measured at 143 k images, over 10 % of an 8 s budget): TAIL_SHARE of
# it, at least TAIL_SECONDS, at most TAIL_MAX_SHARE of it.
TAIL_SHARE = 0.1
TAIL_SECONDS = 2.0
TAIL_MAX_SHARE = 0.3
FLOOR_SECONDS = 1.0  # the least budget a check that has one gets (0 means none)
# The least share a reader before a reserve needs: its start-up (0.1-0.5 s measured for imgest's readers at 143 k
# images) and its warm-up and window (10 batches of 64 at 2,000 images/s, the slowest in train mode: 0.3 s). A
# reserve the check cannot keep beside that for every reader before it buys no turn; its reader is not run.
LEAST_SHARE = 1.0
# A reader whose turn comes with less than this left before the check's deadline is not started: its connection and
# first batch would end past it (Cassandra's readers: 0.10-0.28 s to their first batch at 143 k images).
READER_STARTUP_S = 0.3
# How many of a reader's last batches the time another one needs is judged by (ReadPlan): the longest of them.
RECENT_BATCHES = 4
STEADY_TOLERANCE = 0.1  # a rate is steady when its two halves agree within this fraction

# why a reader stopped (``stop``)
SAMPLE_READ = "sample read"
RATE_STEADY = "rate steady"
SHARE_SPENT = "share spent"
CHECK_SPENT = "check's budget spent"


@dataclass(frozen=True)
class ReaderBudget:
    """One reader's share of the check: SECONDS from its start (its pipeline's build included, then its epoch loop,
    verification included) after which it stops once its window is read; its WARMUP and WINDOW batches (read
    whatever the share); DEADLINE (``time.perf_counter()``; None: none), past which it reads nothing more: the
    check's end for its readers less the reserves KEPT for the readers after it; WINDOW_SECONDS, the least time
    its measured batches span before a steady rate stops it early; STOP_WHEN_STEADY False for a reader whose rate
    varies with where in its sample it reads (its window is the rate of that place): it reads its whole share."""

    seconds: float
    warmup: int = defaults.CHECK_WARMUP_BATCHES
    window: int = defaults.CHECK_WINDOW_BATCHES
    deadline: float | None = None
    window_seconds: float = defaults.CHECK_WINDOW_SECONDS
    stop_when_steady: bool = True
    kept: float = 0.0  # of the check's time before DEADLINE's end, seconds kept for the readers after this one
    # what its reader needs after its last batch, before DEADLINE: AFTER seconds at least, or DRAIN times its last
    # batch's time where that is more (a DALI pipeline's deletion waits for the reads in flight, which take longer
    # on a busy server: imgest.readback.dali_s3)
    after: float = 0.0
    drain: float = 0.0


def check_seconds(
    cap: float,
    run_seconds: float | None,
    images: int = 0,
    share: float = defaults.CHECK_RUN_SHARE,
    spent: float = 0.0,
) -> float:
    """The whole check's budget: CAP seconds (0: no budget); in a run (RUN_SECONDS before the check; None: not in a
    run) of IMAGES from CHECK_SHARE_FROM_IMAGES on, no more than SHARE of the run with the check in it, less the
    SPENT seconds the check's task has already run (its process start, imports), but at least FLOOR_SECONDS.
    Below that count the cap holds: a check must buy a measurement, and 10 % of a one-minute run buys none."""
    if cap <= 0 or run_seconds is None or images < defaults.CHECK_SHARE_FROM_IMAGES:
        return max(0.0, float(cap))
    whole = min(float(cap), share / (1 - share) * max(0.0, run_seconds))
    return round(max(FLOOR_SECONDS, whole - max(0.0, spent)), 1)


def process_age() -> float:
    """Seconds since this process started (Linux /proc; 0 where it cannot tell): the task's own start-up, which
    the run's share counts too."""
    try:
        start_ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])  # noqa: SIM115
        uptime = float(open("/proc/uptime").read().split()[0])  # noqa: SIM115
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def window_rate(batches: list[tuple[int, float]], start: float) -> float:
    """Images/s of BATCHES ((images, end time) each) over the time from START (the end of the batch before them)
    to the end of the last; 0 without any."""
    if not batches or batches[-1][1] <= start:
        return 0.0
    return sum(n for n, _ in batches) / (batches[-1][1] - start)


def halves_agree(batches: list[tuple[int, float]], start: float, tolerance: float = STEADY_TOLERANCE) -> bool:
    """Whether the rate over the first half of BATCHES (from START) and over the second agree within TOLERANCE."""
    half = len(batches) // 2
    if half < 1:
        return False
    first, second = window_rate(batches[:half], start), window_rate(batches[half:], batches[half - 1][1])
    return first > 0 and second > 0 and abs(second - first) <= tolerance * max(first, second)


class ReadPlan:
    """When one reader stops, and what its rate was measured over (see the module): BUDGET None reads the whole
    sample of TOTAL images; START is the epoch loop's start, STARTED the reader's own (before its pipeline's build)."""

    def __init__(
        self,
        budget: ReaderBudget | None,
        total: int,
        start: float | None = None,
        started: float | None = None,
        least: float = 0.0,
    ) -> None:
        self.budget, self.total = budget, total
        self.least = least if budget is not None else 0.0  # seconds its measured batches span at least (a budget's)
        self.start = time.perf_counter() if start is None else start
        self.started = self.start if started is None else min(started, self.start)
        self.warmup = budget.warmup if budget else defaults.CHECK_WARMUP_BATCHES
        self.window = budget.window if budget else defaults.CHECK_WINDOW_BATCHES
        self.batches: list[tuple[int, float]] = []  # (images, end time) of each batch
        self.read = 0
        self.stop = ""

    def more(self, n: int, now: float | None = None) -> bool:
        """Count a batch of N images that ended at NOW; whether the reader reads another."""
        now = time.perf_counter() if now is None else now
        self.read += n
        self.batches.append((n, now))
        self.stop = self._why_stop(now)
        return not self.stop

    def _why_stop(self, now: float) -> str:
        if self.read >= self.total:
            return SAMPLE_READ
        budget = self.budget
        if budget is None:
            return ""
        if budget.deadline is not None and now + self._needs() >= budget.deadline:
            return CHECK_SPENT  # the next batch (and its reader's teardown) would end past the check's deadline
        counted = len(self.batches) - self.warmup  # no slice a batch: a check of every row reads thousands
        if counted < self.window or self.span < self.least:
            return ""  # its warm-up and window whatever its share
        per_batch = (now - self.warmup_end) / counted
        if now - self.started + per_batch > budget.seconds:  # its start-up is part of its share
            return SHARE_SPENT
        if not budget.stop_when_steady:
            return ""
        long_enough = now - self.warmup_end >= budget.window_seconds  # batches of a few ms: noise, not a rate
        return RATE_STEADY if long_enough and halves_agree(self.measured, self.warmup_end) else ""

    def _needs(self) -> float:
        """What another batch needs before the deadline: as long as the longest of the last RECENT_BATCHES (not the
        first's, which is start-up, once there are others: parallel pipelines' batches come in bursts, 0.1 s then
        1.1 s), and the reader's teardown after it (ReaderBudget.after, or drain times that batch's time)."""
        ends = [end for _, end in self.batches[-RECENT_BATCHES - 1 :]]
        first = ends[0] - self.start  # the only batch: its start-up is all there is to go by
        longest = max(0.0, first if len(ends) == 1 else max(b - a for a, b in itertools.pairwise(ends)))
        budget = self.budget
        if budget is None:
            return longest
        return longest + max(budget.after, budget.drain * longest if len(self.batches) > 1 else 0.0)

    @property
    def measured(self) -> list[tuple[int, float]]:
        """The batches after the warm-up: what the steady rate is measured over."""
        return self.batches[self.warmup :]

    @property
    def warmup_end(self) -> float:
        """When the warm-up's last batch ended (the epoch loop's start without a warm-up)."""
        if self.warmup < 1 or not self.batches:
            return self.start
        return self.batches[min(self.warmup, len(self.batches)) - 1][1]

    @property
    def span(self) -> float:
        """Seconds its measured batches span (0 before any)."""
        return self.batches[-1][1] - self.warmup_end if len(self.batches) > self.warmup else 0.0

    @property
    def steady(self) -> bool:
        """Whether the rate spans the window (its batches, and its least seconds unless it read its whole sample): a
        reader's throughput, not its start-up."""
        return len(self.measured) >= self.window and (self.span >= self.least or self.read >= self.total)

    @property
    def steady_rate(self) -> float:
        return window_rate(self.measured, self.warmup_end)

    @property
    def cut(self) -> bool:
        """Whether it stopped before the end of its sample."""
        return self.stop not in ("", SAMPLE_READ) and self.read < self.total

    def _window_end(self) -> float | None:
        """When its warm-up and window had been read (None: they never were)."""
        k = self.warmup + self.window
        return self.batches[k - 1][1] if len(self.batches) >= k else None

    def rate_note(self) -> str:
        """Why its rate is not a throughput ('' when it is)."""
        if self.steady:
            return ""
        why = self._spent() if self.stop == CHECK_SPENT else "its sample ended"
        if len(self.measured) >= self.window:
            return (
                f"not a steady rate: its {len(self.measured)} measured batches span {self.span:.2f} s, less than the "
                f"{self.least:.2f} s this reader's rate needs to settle ({why} first)"
            )
        return (
            f"not a steady rate: {len(self.measured)} batches measured after its {self.warmup} warm-up batches, "
            f"fewer than the {self.window} a steady rate needs ({why} first)"
        )

    def reason(self) -> str:
        """Why it stopped before the end of its sample ('' when it read all of it)."""
        if not self.cut or self.budget is None:
            return ""
        rate, k = f"{self.steady_rate:.1f}", len(self.measured)
        why = {
            RATE_STEADY: f"its rate was steady after {k} measured batches ({rate} images/s, halves within "
            f"{STEADY_TOLERANCE:.0%})",
            SHARE_SPENT: f"its {self.budget.seconds:.1f} s share was spent at {rate} images/s",
            CHECK_SPENT: self._spent(),
        }[self.stop]
        text = f"{why}: read {self.read} of the {self.total} images of the sample"
        end = self._window_end()
        if end is not None and end - self.started > self.budget.seconds:
            text += (
                f"; a slow reader's bounded sample: its start-up, {self.warmup} warm-up and {self.window} measured "
                f"batches took {end - self.started:.1f} s, over its {self.budget.seconds:.1f} s share"
            )
        return text

    def _spent(self) -> str:
        """What CHECK_SPENT says: the check's budget, or the part of it kept for the readers after this one."""
        kept = self.budget.kept if self.budget is not None else 0.0
        if kept > 0:
            return f"the check's time before the {kept:.1f} s kept for the readers after it was spent"
        return "the check's budget was spent"

    def fields(self) -> dict[str, Any]:
        """What a reader's result records of its plan: start-up, steady rate, budget, why it stopped."""
        first = self.batches[0][1] if self.batches else self.start
        return {
            "startup_s": round(first - self.started, 3),
            "warmup_s": round(self.warmup_end - self.started, 3),
            "warmup_batches": min(self.warmup, len(self.batches)),
            "steady_batches": len(self.measured),
            "steady_images": sum(n for n, _ in self.measured),
            "steady_s": round(self.span, 3),
            "least_window_s": self.least,
            "steady_rate": round(self.steady_rate, 1),
            "steady": self.steady,
            "rate_note": self.rate_note(),
            "budget_s": round(self.budget.seconds, 2) if self.budget else 0.0,
            "budget_cut": self.cut,
            "stop": self.stop,
            "unread": max(0, self.total - self.read) if self.cut else 0,
            "reason": self.reason(),
        }


class CheckClock:
    """The check's budget handed to its readers in turn: each gets an equal share of the time left before the
    readers' deadline over the readers still to run; SECONDS 0: no budget (every reader reads its whole sample)."""

    def __init__(
        self,
        seconds: float,
        warmup: int = defaults.CHECK_WARMUP_BATCHES,
        window: int = defaults.CHECK_WINDOW_BATCHES,
        start: float | None = None,
        window_seconds: float = defaults.CHECK_WINDOW_SECONDS,
    ) -> None:
        self.warmup, self.window = warmup, window
        self.window_seconds = window_seconds
        self.start = time.perf_counter() if start is None else start
        self.runs_left = 0
        self.reserved = 0.0  # of the time left, kept for readers still to run that asked for a reserve
        self.set_seconds(seconds)

    def set_seconds(self, seconds: float) -> None:
        """The check's budget, from its start, once it is known (it follows from the sample's count)."""
        self.seconds = seconds
        self.deadline = self.start + seconds - tail_seconds(seconds)

    def expect(self, runs: int, reserve: float = 0.0) -> None:
        """RUNS more readers will ask for a share, each keeping RESERVE seconds of the time left for itself: the
        readers before it share only what is left beyond the reserves (a reader that runs last and whose start-up
        takes seconds, DALI's s3:// one, is not starved by the ones before it reading their whole shares)."""
        self.runs_left += runs
        self.reserved += runs * max(0.0, reserve)

    def affords(self, turns: int, reserve: float, before: int, now: float | None = None) -> int:
        """How many of TURNS readers, each keeping RESERVE seconds (:meth:`expect`), the time left before the deadline
        buys beside LEAST_SHARE for every reader already expected and BEFORE more (0 to TURNS; TURNS without a
        budget): a reserve kept where it buys no turn only starves the readers before it."""
        if self.seconds <= 0 or reserve <= 0:
            return turns
        now = time.perf_counter() if now is None else now
        left = self.deadline - now - self.reserved - (self.runs_left + before) * LEAST_SHARE
        return max(0, min(turns, int(left // reserve)))

    def next(self, now: float | None = None, reserve: float = 0.0) -> ReaderBudget | None:
        """The next reader's budget (None: no budget): its RESERVE (what it asked for in :meth:`expect`) and an
        equal share of the time left beyond every reserve."""
        if self.seconds <= 0:
            return None
        now = time.perf_counter() if now is None else now
        free = max(0.0, self.deadline - now - self.reserved)
        own = min(max(0.0, reserve), self.reserved)
        share = own + free / max(1, self.runs_left)
        self.runs_left = max(0, self.runs_left - 1)
        self.reserved -= own
        # the later readers' reserves (at most the time left): never this reader's time
        kept = min(self.reserved, max(0.0, self.deadline - now)) if self.runs_left else 0.0
        deadline = self.deadline - kept
        share = min(share, max(0.0, deadline - now))
        return ReaderBudget(round(share, 3), self.warmup, self.window, deadline, self.window_seconds, kept=kept)

    def elapsed(self) -> float:
        """Seconds since the check started."""
        return time.perf_counter() - self.start


def least_window(reader: str, mode: str) -> float:
    """The least seconds READER's measured batches in MODE span before its rate is a throughput
    (defaults.CHECK_LEAST_WINDOW_S)."""
    return defaults.CHECK_LEAST_WINDOW_S.get((reader, mode), defaults.CHECK_LEAST_WINDOW_DEFAULT_S)


def tail_seconds(seconds: float) -> float:
    """What a budget of SECONDS keeps for after its readers (see TAIL_SHARE)."""
    return min(max(TAIL_SHARE * seconds, TAIL_SECONDS), TAIL_MAX_SHARE * seconds)


def expect(clock: CheckClock | None, runs: int, reserve: float = 0.0) -> None:
    """Tell CLOCK (if any) that RUNS readers will ask for a share, each keeping RESERVE seconds (CheckClock.expect)."""
    if clock is not None:
        clock.expect(runs, reserve)


def spent_before(budget: ReaderBudget | None, now: float | None = None, startup: float = 0.0) -> bool:
    """Whether less than STARTUP seconds were left before the check's deadline when BUDGET's reader's turn came: a
    reader whose start-up takes seconds (DALI's s3:// pipelines, webdataset's torch) is then not run, so the check
    keeps to its budget."""
    if budget is None or budget.deadline is None:
        return False
    return (time.perf_counter() if now is None else now) + startup >= budget.deadline


def affords(clock: CheckClock | None, turns: int, reserve: float, before: int) -> int:
    """CheckClock.affords of CLOCK; TURNS without a clock (no budget)."""
    return turns if clock is None else clock.affords(turns, reserve, before)


def next_budget(clock: CheckClock | None, stop_when_steady: bool = True, reserve: float = 0.0) -> ReaderBudget | None:
    """The next reader's budget from CLOCK; None without a clock (no budget). STOP_WHEN_STEADY: see ReaderBudget;
    RESERVE: what this reader kept for itself when it was expected (CheckClock.expect)."""
    budget = clock.next(reserve=reserve) if clock is not None else None
    return replace(budget, stop_when_steady=False) if budget is not None and not stop_when_steady else budget
