"""How much a reader requests ahead of its consumer: rate x round trip, grown from a slow start, capped by memory.

``AdaptiveWindow`` sizes the read-ahead of the Cassandra reader (rows) and the S3 stream reader (shards) from
what it observes, the way a TCP sender sizes its congestion window from delivery rate and round trip (BBR):

- every request is stamped when sent with the units delivered so far; when it lands, the units delivered
  meanwhile over its round trip are one delivery-rate sample, and its round trip one round-trip sample;
- the window is ``gain`` x (the highest recent delivery rate) x (the lowest round trip seen), kept between a
  floor (the slow start: the first window) and a cap (a memory bound, and the requests-in-flight bound);
- a window that limits the rate gives samples of about window / round trip, so the target is the gain times
  the window: in the slow start it doubles each round trip (``startup_gain`` 2) until the
  delivery rate stops growing (less than 25 % in two round trips: the server or the consumer, not the window,
  sets the rate); from then on the window holds ``gain`` (1.5) x rate x round trip, re-measured as it goes
  (a window larger than that only adds requests queued at the server: measured slower here);
- a reader starts each epoch from the window its last epoch ended with (``start``), the floor only the first time;
  while an epoch's last requests drain the window holds its size (``hold``), so the next starts from the steady one;
  a reader that keeps one window over its epochs (the Cassandra reader) ends each epoch's stats with
  ``finish(restart=True)`` and goes on from the same estimates;
- samples taken while the consumer, not the path, holds the rate back (``app_limited``: most of the window landed
  and waits to be taken, say while a reader opens its connections or between epochs) neither shrink the window
  nor end its slow start (BBR leaves such samples out the same way);
- ``jump`` raises the window at once to a size the reader has reason to expect (say the bandwidth it opened
  connections for times the round trip it timed) and keeps it at least there until the slow start ends, so a far
  server does not cost several round trips of doubling.

On a fast link the window stays at its floor (little memory, no extra contention); 100 ms away it grows to
hold a round trip of data. ``WindowStats`` records what happened, for logs, benchmarks and tests.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

RATE_SAMPLES = 64  # delivery-rate samples the max filter looks back over
TRACE_POINTS = 48  # the window's course over an epoch is kept at about this many points (halved as it fills)
PLATEAU = 1.25  # the slow start ends when the best rate grew less than this ...
PLATEAU_ROUNDS = 2  # ... over this many round trips in a row


@dataclass
class WindowStats:
    """What one epoch's window did: its sizes (in the reader's units), growths, and what it was sized from."""

    unit: str
    adaptive: bool
    initial: float
    final: float = 0.0
    peak: float = 0.0
    growths: int = 0  # times the window grew by at least a quarter of itself
    startup_rounds: int = 0  # round trips spent in the slow start
    capped: bool = False  # the memory or requests bound held it back at least once
    samples: int = 0
    min_rtt_ms: float | None = None
    max_rate: float = 0.0  # units per second
    # the window over time: [ms since the epoch began, window size, units requested and not yet consumed (when the
    # reader tells), best delivery rate x lowest round trip] at about TRACE_POINTS evenly spaced landings
    trace: list[list[float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class AdaptiveWindow:
    """A read-ahead window in UNITs (rows, bytes), adaptive or fixed; not thread-safe (callers hold their lock)."""

    def __init__(
        self,
        unit: str,
        initial: float,
        cap: float,
        *,
        adaptive: bool = True,
        gain: float = 1.5,
        startup_gain: float = 2.0,
        start: float | None = None,
        least: float | None = None,
    ) -> None:
        self.least = float(initial if least is None else least)  # the smallest window a lower cap may leave
        self.floor, self.cap, self.gain, self.adaptive = float(initial), float(max(cap, initial)), gain, adaptive
        self.stats_unit = unit
        self.startup_gain = startup_gain
        self.in_startup = True
        self._round_end = 0.0  # when the current round trip ends (a round: the lowest round trip seen)
        self._round_rate = 0.0  # the best rate at the start of the current plateau check
        self._flat_rounds = 0
        self.size = min(self.cap, max(self.floor, start or 0.0)) if adaptive else self.floor
        self.delivered = 0.0
        self.min_rtt = math.inf
        self._rates: deque[float] = deque(maxlen=RATE_SAMPLES)
        self._grown_from = self.size
        self._startup_floor = 0.0  # what jump() set: the window stays at least there until the slow start ends
        self._begin_stats()

    def _begin_stats(self) -> None:
        self.stats = WindowStats(self.stats_unit, self.adaptive, self.size, self.size, self.size)
        self._t0 = time.perf_counter()
        self._trace_every = 1  # keep every n-th landing in the trace (doubles whenever the trace fills)
        self._traced = 0  # the landing the trace's last point is from
        self._last: tuple[float, float, float | None] | None = None  # the last landing's (time, best rate, outstanding)

    def stamp(self) -> tuple[float, float]:
        """The token of a request sent now: (time, units delivered so far)."""
        return time.perf_counter(), self.delivered

    def set_cap(self, cap: float) -> None:
        """Lower or raise the memory bound (say once the size of a row or a shard is known): it holds over the slow
        start's first window too, down to the least window (``least``, say one batch)."""
        self.cap = max(self.least, cap)
        self.floor = min(self.floor, self.cap)
        if self.size > self.cap:
            self.size = self.cap
            self.stats.capped = True

    def jump(self, units: float) -> None:
        """Raise an adaptive window still in its slow start to UNITS now (within its cap), and keep it at least
        there until the slow start ends; a smaller UNITS, a fixed window or one past its slow start: nothing."""
        if not (self.adaptive and self.in_startup) or units <= self.size:
            return
        self._startup_floor = min(self.cap, float(units))
        self.size = max(self.size, self._startup_floor)
        if self.size >= 1.25 * self._grown_from:
            self.stats.growths += 1
            self._grown_from = self.size
        self.stats.peak = max(self.stats.peak, self.size)

    def landed(
        self,
        token: tuple[float, float],
        units: float,
        outstanding: float | None = None,
        hold: bool = False,
        app_limited: bool = False,
    ) -> None:
        """A request sent with TOKEN delivered UNITS: take its samples and resize the window (OUTSTANDING: the units
        the reader has requested and not yet handed on, for the trace; HOLD: keep the size, say while the epoch's
        last requests drain; APP_LIMITED: the consumer holds the rate back, so the window may grow, not shrink,
        and the slow start goes on)."""
        now = time.perf_counter()
        sent, delivered_then = token
        self.delivered += units
        rtt = max(now - sent, 1e-6)
        self.min_rtt = min(self.min_rtt, rtt)
        self._rates.append((self.delivered - delivered_then) / rtt)
        self.stats.samples += 1
        best = max(self._rates)
        if self.adaptive and not hold:
            self._resize(now, best, app_limited)
        self._last = (now, best, outstanding)
        if self.stats.samples % self._trace_every == 0:
            self._trace(now, best, outstanding)
            self._traced = self.stats.samples

    def _resize(self, now: float, best: float, app_limited: bool = False) -> None:
        if self.in_startup and now >= self._round_end and not app_limited:  # a round trip on: did the rate grow?
            self.stats.startup_rounds += 1
            self._flat_rounds = self._flat_rounds + 1 if best < PLATEAU * self._round_rate else 0
            self._round_rate = max(self._round_rate, best) if self._flat_rounds else best
            self._round_end = now + self.min_rtt
            self.in_startup = self._flat_rounds < PLATEAU_ROUNDS
        target = (self.startup_gain if self.in_startup else self.gain) * best * self.min_rtt
        if target > self.cap:
            self.stats.capped = True
        floor = max(self.floor, self._startup_floor) if self.in_startup else self.floor
        if app_limited:  # the consumer's pace says nothing about the path's: keep what the window has
            floor = max(floor, self.size)
        self.size = min(self.cap, max(floor, target))
        if self.size >= 1.25 * self._grown_from:
            self.stats.growths += 1
            self._grown_from = self.size
        elif self.size < self._grown_from:
            self._grown_from = self.size
        self.stats.peak = max(self.stats.peak, self.size)

    def _trace(self, now: float, best: float, outstanding: float | None) -> None:
        trace = self.stats.trace
        point = [(now - self._t0) * 1000, self.size, -1.0 if outstanding is None else outstanding, best * self.min_rtt]
        trace.append([round(v, 1) for v in point])
        if len(trace) >= 2 * TRACE_POINTS:  # keep every other point, and from now on every other landing
            del trace[1::2]
            self._trace_every *= 2

    def finish(self, restart: bool = False) -> WindowStats:
        """The stats of the epoch, with the final size and the estimates it was sized from; RESTART: the window
        goes on (same size and estimates) and new stats begin, for the next epoch."""
        if self._last is not None and self._traced != self.stats.samples:  # the trace ends with the last landing
            self._trace(*self._last)
            self._traced = self.stats.samples
        stats = self.stats
        stats.final = self.size
        stats.peak = max(stats.peak, self.size)
        stats.min_rtt_ms = round(self.min_rtt * 1000, 2) if self.min_rtt < math.inf else None
        stats.max_rate = round(max(self._rates, default=0.0), 1)
        if restart:
            self._begin_stats()
        return stats
