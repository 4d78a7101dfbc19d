"""The read-back check's time budget: how long each reader reads, and what it says when the budget cut it short.

The check has a budget of seconds from its start (choosing the sample included), of which its readers share all
but its tail (``tail_seconds``: kept for the report, the plot and the task's exit). When its turn comes each reader
gets an equal share of the time left over the readers still to run (:class:`CheckClock`), so one that ran long (a
slow pipeline build) costs the readers after it, not the bound. A reader reads ``min_batches`` batches whatever its
share: the first is start-up (a pipeline's first ``run()`` fills its prefetch queue), the ones after it give its
rate; from that rate
(:class:`ReadPlan`) it reads as many more whole batches as fit its share, and stops sooner if its share runs out
(the rate fell). Every image it reads is verified as before; the images of the sample it did not read are counted
(``unread``), not reported as missing, and its result says so: ``budget_cut``, ``budget_rate``, ``planned`` and
``reason``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from imgest.core import defaults

# Kept of the check's budget for what follows its readers: the report, the plot, recording the check and the task's
# exit (torch's and DALI's teardown: 1.6-2 s measured at 143 k images, over 10 % of an 8 s budget): TAIL_SHARE of
# it, at least TAIL_SECONDS, at most TAIL_MAX_SHARE of it.
TAIL_SHARE = 0.1
TAIL_SECONDS = 2.0
TAIL_MAX_SHARE = 0.3
FLOOR_SECONDS = 1.0  # the least budget a check that has one gets (0 means none): its readers read their minimum


@dataclass(frozen=True)
class ReaderBudget:
    """One reader's share of the check: SECONDS of its epoch loop (verification included; 0: its minimum only) and
    the batches it reads whatever the share."""

    seconds: float
    min_batches: int = defaults.CHECK_MIN_BATCHES


def check_seconds(
    cap: float, run_seconds: float | None, share: float = defaults.CHECK_RUN_SHARE, spent: float = 0.0
) -> float:
    """The whole check's budget: CAP seconds (0: no budget), and after a run's RUN_SECONDS (the time before the
    check; None: not in a run) no more than SHARE of the run with the check in it, less the SPENT seconds the
    check's task has already run (its process start, imports), but at least FLOOR_SECONDS."""
    if cap <= 0 or run_seconds is None:
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


def planned_images(read: int, elapsed: float, rate: float, seconds: float, total: int, batch_size: int) -> int:
    """Images a reader reads in all: the READ ones (in ELAPSED seconds), then as many whole batches as RATE
    (images/s) fits in the rest of SECONDS; never more than TOTAL, never fewer than READ."""
    room = max(0.0, seconds - elapsed) * max(0.0, rate)
    more = int(room // max(1, batch_size)) * max(1, batch_size)
    return max(read, min(total, read + more))


class ReadPlan:
    """When one reader stops: after its minimum batches, once it has read the images their rate fits in its
    budget, or when the budget is spent; with no budget (None), at the end of the epoch."""

    def __init__(self, budget: ReaderBudget | None, total: int, start: float | None = None) -> None:
        self.budget, self.total = budget, total
        self.start = time.perf_counter() if start is None else start
        self.read = self.batches = self.batch_size = 0
        self.limit = total
        self.rate: float | None = None
        self.out_of_time = False
        self._first: tuple[int, float] | None = None  # images read and the time at the end of the first batch

    def more(self, n: int, now: float | None = None) -> bool:
        """Count a batch of N images that ended at NOW; whether the reader reads another."""
        now = time.perf_counter() if now is None else now
        self.read, self.batches, self.batch_size = self.read + n, self.batches + 1, max(self.batch_size, n)
        if self._first is None:
            self._first = (self.read, now)
        if self.budget is None or self.batches < max(1, self.budget.min_batches):
            return self.read < self.total
        elapsed = now - self.start
        if self.rate is None:
            self.rate = self._rate(now)
            self.limit = planned_images(self.read, elapsed, self.rate, self.budget.seconds, self.total, self.batch_size)
        if elapsed >= self.budget.seconds and self.read < self.limit:
            self.limit, self.out_of_time = self.read, True
        return self.read < self.limit

    def _rate(self, now: float) -> float:
        """Images/s since the first batch (start-up left out); over the first alone when it is the only one."""
        first_read, first_at = self._first or (0, self.start)
        if self.batches > 1 and now > first_at:
            return (self.read - first_read) / (now - first_at)
        return self.read / max(now - self.start, 1e-9)

    @property
    def cut(self) -> bool:
        """Whether the budget stopped the reader before the end of its sample."""
        return self.budget is not None and self.read >= self.limit and self.limit < self.total

    def reason(self) -> str:
        """Why the reader stopped where it did ('' when it read everything it was given)."""
        if not self.cut or self.budget is None:
            return ""
        rate = f"{self.rate:.1f}" if self.rate is not None else "?"
        why = f"its {self.budget.seconds:.1f} s budget at {rate} images/s (its first batches) fit {self.limit}"
        fell = "; its budget ran out before that (the rate fell)" if self.out_of_time else ""
        return f"{why} of the {self.total} images of the sample{fell}"

    def fields(self) -> dict[str, Any]:
        """What a reader's result records of its budget."""
        return {
            "budget_s": round(self.budget.seconds, 2) if self.budget else 0.0,
            "budget_rate": round(self.rate, 1) if self.rate is not None else 0.0,
            "budget_cut": self.cut,
            "planned": self.limit,
            "unread": max(0, self.total - self.read) if self.cut else 0,
            "reason": self.reason(),
        }


class CheckClock:
    """The check's budget handed to its readers in turn: each gets an equal share of the time left before the
    readers' deadline over the readers still to run; SECONDS 0: no budget (every reader reads its whole sample)."""

    def __init__(
        self, seconds: float, min_batches: int = defaults.CHECK_MIN_BATCHES, start: float | None = None
    ) -> None:
        self.seconds, self.min_batches = seconds, min_batches
        self.start = time.perf_counter() if start is None else start
        self.deadline = self.start + seconds - tail_seconds(seconds)
        self.runs_left = 0

    def expect(self, runs: int) -> None:
        """RUNS more readers will ask for a share."""
        self.runs_left += runs

    def next(self, now: float | None = None) -> ReaderBudget | None:
        """The next reader's budget (None: no budget)."""
        if self.seconds <= 0:
            return None
        now = time.perf_counter() if now is None else now
        share = max(0.0, self.deadline - now) / max(1, self.runs_left)
        self.runs_left = max(0, self.runs_left - 1)
        return ReaderBudget(round(share, 3), self.min_batches)

    def elapsed(self) -> float:
        """Seconds since the check started."""
        return time.perf_counter() - self.start


def tail_seconds(seconds: float) -> float:
    """What a budget of SECONDS keeps for after its readers (see TAIL_SHARE)."""
    return min(max(TAIL_SHARE * seconds, TAIL_SECONDS), TAIL_MAX_SHARE * seconds)


def expect(clock: CheckClock | None, runs: int) -> None:
    """Tell CLOCK (if any) that RUNS readers will ask for a share."""
    if clock is not None:
        clock.expect(runs)


def next_budget(clock: CheckClock | None) -> ReaderBudget | None:
    """The next reader's budget from CLOCK; None without a clock (no budget)."""
    return clock.next() if clock is not None else None
