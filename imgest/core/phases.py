"""Wall seconds per phase of a job, for its summary: where a run's fixed cost goes (session start, schema,
manifest) and where its per-row cost goes (the write)."""

from __future__ import annotations

import time


class PhaseClock:
    """Laps of a monotonic clock: ``lap(name)`` records the seconds since the previous lap (or creation)."""

    def __init__(self) -> None:
        self._last = time.monotonic()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> float:
        """Record NAME as the seconds since the last lap and return them (a repeated NAME accumulates)."""
        now = time.monotonic()
        seconds, self._last = now - self._last, now
        self.laps[name] = round(self.laps.get(name, 0.0) + seconds, 3)
        return seconds
