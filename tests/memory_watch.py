"""The suite's memory, watched from the pytest process that runs the session (the xdist controller): the lowest
memory available and the largest processes at that moment, for the summary. When the kernel's OOM killer takes a
server mid-suite, every later test only says it did not answer; this says what held the memory."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

GIB = 1 << 30
EVERY_S = 5.0
TOP = 8


def available_bytes() -> tuple[int, int]:
    """(MemAvailable, MemTotal) in bytes, from /proc/meminfo."""
    values = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        values[name] = int(rest.split()[0]) * 1024
    return values["MemAvailable"], values["MemTotal"]


def describe(argv: list[str]) -> str:
    """A process as a person names it: a JVM by its main class and the words after it, else its first words."""
    if argv and argv[0].endswith("java"):
        rest = iter(argv[1:])
        for arg in rest:
            if arg in ("-cp", "-classpath", "--class-path"):
                next(rest, None)
            elif not arg.startswith("-"):
                return " ".join(["java", arg, *list(rest)[:2]])[:110]
    return " ".join(Path(argv[0]).name if i == 0 else a for i, a in enumerate(argv[:4]))[:110] if argv else "?"


def largest(count: int = TOP) -> list[tuple[int, int, str]]:
    """The COUNT processes with the most resident memory: (bytes, pid, what)."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            rss = next((line for line in status.read_text().splitlines() if line.startswith("VmRSS:")), "")
            argv = (status.parent / "cmdline").read_bytes().decode("utf-8", "replace").split("\0")
        except OSError:
            continue
        if rss:
            found.append((int(rss.split()[1]) * 1024, int(status.parent.name), describe([a for a in argv if a])))
    return sorted(found, reverse=True)[:count]


@dataclass
class MemoryWatch:
    """Samples every EVERY_S seconds in a daemon thread; keeps the lowest sample and who held the memory then."""

    started: float = field(default_factory=time.monotonic)
    lowest: int | None = None
    total: int = 0
    at: float = 0.0
    running: list[str] = field(default_factory=list)
    holders: list[tuple[int, int, str]] = field(default_factory=list)
    recent: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self.sample()
        threading.Thread(target=self._loop, name="memory-watch", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def test_started(self, nodeid: str) -> None:
        self.recent = [*self.recent[-1:], nodeid]  # two workers: the last two tests started

    def _loop(self) -> None:
        while not self._stop.wait(EVERY_S):
            self.sample()

    def sample(self) -> None:
        available, self.total = available_bytes()
        if self.lowest is None or available < self.lowest:
            self.lowest, self.at = available, time.monotonic() - self.started
            self.running, self.holders = list(self.recent), largest()

    def summary(self) -> list[str]:
        if self.lowest is None:
            return []
        lines = [
            f"memory: lowest {self.lowest / GIB:.1f} GiB available of {self.total / GIB:.1f} GiB, "
            f"{self.at / 60:.0f} min in (the tests last started: {', '.join(self.running) or 'none'}); largest then:"
        ]
        lines += [f"  {rss / GIB:5.2f} GiB  pid {pid}  {what}" for rss, pid, what in self.holders]
        return lines
