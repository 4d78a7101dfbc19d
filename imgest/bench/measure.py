"""The benchmarks' measuring harness, shared by every benchmark: what one step cost and whether the machine was
quiet meanwhile.

- the spread of a figure over rounds (:func:`spread`), the fixed-cost fits (:func:`fixed_cost`, :func:`fit_line`)
  and the target checks (:func:`meets`);
- process-tree sampling from /proc: CPU seconds (:func:`tree_seconds`, :class:`TreeSampler`), the whole machine's
  busy CPU (:func:`busy_seconds`), and peak RSS per role (:class:`RssSampler`);
- the quiet-machine record (:class:`QuietWatch`, :class:`Quietness`). A figure measured while something else used
  the cores says as much about that other thing as about the code, so every committed benchmark records, over its
  run: the load averages at the start and the end, the whole machine's busy CPU time (``/proc/stat``) and the part
  of it spent by this benchmark's own processes (this process, every process started under it, and the servers it
  measures against, named by PID: :func:`server_pids`) and by kernel threads (the writeback and reclaim its own
  I/O causes; reported apart). The rest, in cores, is the other processes' share; above :data:`QUIET_CORES` the
  run is not quiet, and a report must not call a target met on it.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any


def spread(values: list[float]) -> dict[str, float]:
    """The median, min and max of VALUES (a figure over rounds), to two decimals."""
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2), "max": round(max(values), 2)}


def meets(value: float, target: float | None, *, at_most: bool = False) -> bool | None:
    """Whether VALUE meets TARGET: at least it (a speed-up, a rate), or AT_MOST it (a time ratio); None: no target."""
    if target is None:
        return None
    return value <= target if at_most else value >= target


def fixed_cost(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(fixed seconds, seconds per image) of a least-squares line through (images, seconds); fixed >= 0."""
    import numpy as np

    xs, ys = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
    if len(points) < 2:
        return 0.0, float(ys[0] / xs[0]) if len(points) else 0.0
    slope, intercept = np.polyfit(xs, ys, 1)
    return max(0.0, float(intercept)), float(slope)


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of YS over XS; with one point, no intercept."""
    if len(xs) < 2:
        return 0.0, ys[0] / xs[0]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


QUIET_CORES = 0.1  # other processes' CPU, in cores, over the run: at most a tenth of a core
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def busy_seconds() -> float:
    """The machine's busy CPU time since boot: every /proc/stat 'cpu' field but idle, iowait and steal."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    steal = fields[7] if len(fields) > 7 else 0  # time the hypervisor gave others: not ours, not idle
    return (sum(fields[:8]) - idle - steal) / _TICK


def _processes() -> dict[int, tuple[int, str, float, float]]:
    """pid -> (parent pid, start time, own CPU seconds (utime + stime), its reaped children's (cutime + cstime))."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        own = (int(stat[11]) + int(stat[12])) / _TICK
        out[int(entry)] = (int(stat[1]), stat[19], own, (int(stat[13]) + int(stat[14])) / _TICK)
    return out


def _descendants(procs: dict[int, tuple[int, str, float, float]], roots: Iterable[int]) -> set[int]:
    """ROOTS and every process under them in PROCS, however deep."""
    members = {p for p in roots if p}
    grown = members
    while grown:
        grown = {pid for pid, (ppid, *_) in procs.items() if ppid in members and pid not in members}
        members |= grown
    return members


def tree_seconds(pids: Iterable[int]) -> float:
    """CPU seconds of PIDS and every live descendant, with what their exited children handed to them."""
    procs = _processes()
    return sum(procs[p][2] + procs[p][3] for p in _descendants(procs, pids) if p in procs)


def _subreaper(on: bool) -> None:
    """Make this process the child subreaper of its descendants (Linux prctl PR_SET_CHILD_SUBREAPER)."""
    import contextlib
    import ctypes

    with contextlib.suppress(OSError, AttributeError):  # not Linux: orphans go to init (errs to 'not quiet')
        ctypes.CDLL(None, use_errno=True).prctl(36, int(on), 0, 0, 0)


@dataclass
class Quietness:
    """The other processes' CPU over a run, and the load averages around it."""

    seconds: float = 0.0
    load_start: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_end: tuple[float, float, float] = (0.0, 0.0, 0.0)
    busy_cores: float = 0.0  # the whole machine's busy CPU over the run, in cores
    ours_cores: float = 0.0  # this benchmark's processes and servers
    kernel_cores: float = 0.0  # kernel threads (writeback, page reclaim: mostly the benchmark's own I/O)
    other_cores: float = 0.0  # everything else

    @property
    def quiet(self) -> bool:
        return self.other_cores <= QUIET_CORES

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "quiet": self.quiet, "quiet_limit_cores": QUIET_CORES}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Quietness:
        """The Quietness a to_dict() record (a report's ``quiet``) describes."""
        return cls(**{k: v for k, v in record.items() if k in cls.__dataclass_fields__})

    def describe(self) -> str:
        verdict = "quiet" if self.quiet else f"NOT quiet (other processes above {QUIET_CORES} cores)"
        return (
            f"machine over the run ({self.seconds:.0f} s): {self.busy_cores:.2f} cores busy, "
            f"{self.ours_cores:.2f} of them this benchmark and its servers, {self.kernel_cores:.2f} kernel threads, "
            f"{self.other_cores:.2f} other processes; "
            f"load average {self.load_start[0]:.2f} -> {self.load_end[0]:.2f}: {verdict}"
        )


class TreeSampler:
    """The CPU of a process tree, by sampling /proc every INTERVAL seconds from a thread: every process seen as a
    descendant of ROOTS is remembered (by pid and start time) with the last CPU time read, so a process keeps
    counting after its parent exits and it is re-parented. What a process spends after its last sample, and a
    process that lives less than INTERVAL, is missed: the error leans towards 'not quiet'."""

    def __init__(self, roots: Iterable[int], interval: float = 0.25) -> None:
        self.roots, self.interval = {p for p in roots if p}, interval
        self.first: dict[tuple[int, str], float] = {}
        self.last: dict[tuple[int, str], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="quiet-sampler", daemon=True)

    def sample(self) -> None:
        procs = _processes()
        for pid in _descendants(procs, {key[0] for key in self.last} | self.roots):
            if pid in procs:
                _, started, cpu, _ = procs[pid]
                self.first.setdefault((pid, started), cpu)
                self.last[(pid, started)] = cpu

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> TreeSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def seconds(self) -> float:
        """CPU seconds the tree spent between enter and exit."""
        return sum(cpu - self.first[key] for key, cpu in self.last.items())


class QuietWatch:
    """Measures a run's Quietness: ``with QuietWatch(server_pids) as w: ...`` then ``w.result``."""

    def __init__(self, server_pids: Iterable[int] = ()) -> None:
        self.result = Quietness()
        self.tree = TreeSampler([os.getpid(), *server_pids])

    def __enter__(self) -> QuietWatch:
        _subreaper(True)  # orphans of the tree are re-parented here, not to init: still ours, their zombies too
        self._t0, self._busy0 = time.monotonic(), busy_seconds()
        self._ours0 = tree_seconds(self.tree.roots)
        self._kernel0 = tree_seconds([2])  # kthreadd and the kernel threads under it
        self.result.load_start = os.getloadavg()
        self.tree.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.tree.__exit__()
        wall = max(time.monotonic() - self._t0, 1e-9)
        # two measures that each miss something (reaped CPU misses orphans reaped elsewhere; sampling misses what a
        # process spends after its last sample): the larger is still an underestimate, which errs to 'not quiet'
        busy = busy_seconds() - self._busy0
        ours = max(self.tree.seconds(), tree_seconds(self.tree.roots) - self._ours0)
        kernel = tree_seconds([2]) - self._kernel0
        _subreaper(False)
        r = self.result
        r.seconds, r.load_end = round(wall, 1), os.getloadavg()
        r.busy_cores, r.ours_cores = round(busy / wall, 3), round(ours / wall, 3)
        r.kernel_cores = round(kernel / wall, 3)
        r.other_cores = round(max(0.0, busy - ours - kernel) / wall, 3)


@dataclass
class Peaks:
    """Peak RSS per role of one step (bytes): largest single process, and the role's sum at one instant."""

    single: dict[str, int] = field(default_factory=dict)
    total: dict[str, int] = field(default_factory=dict)

    def add(self, samples: dict[str, list[int]]) -> None:
        for role, values in samples.items():
            if not values:
                continue
            self.single[role] = max(self.single.get(role, 0), max(values))
            self.total[role] = max(self.total.get(role, 0), sum(values))


class RssSampler:
    """Samples the RSS of the process tree of PID and of the processes EXTRA (psutil processes: servers) every
    INTERVAL seconds, in a thread; ROLE(cmdline, PID, pid) names what a process is (None: not measured), and the
    peaks go to ``self.peaks`` per role."""

    def __init__(
        self,
        pid: int,
        role: Callable[[list[str], int, int], str | None],
        extra: Iterable[Any] = (),
        interval: float = 0.2,
    ) -> None:
        self.pid, self.role, self.interval, self.peaks = pid, role, interval, Peaks()
        self._extra = list(extra)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        import psutil

        samples: dict[str, list[int]] = {}
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True), *self._extra]
        except psutil.NoSuchProcess:
            return
        for proc in procs:
            try:
                role = self.role(proc.cmdline(), self.pid, proc.pid)
                if role:
                    rss = proc.memory_info().rss  # read before the role's list exists: a process gone here adds none
                    samples.setdefault(role, []).append(rss)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        if samples:
            self.peaks.add(samples)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> RssSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def server_pids() -> list[int]:
    """PIDs of the embedded servers a benchmark measures against (Cassandra, SeaweedFS, Toxiproxy) that run."""
    from imgest.services import CassandraServer, S3Server
    from imgest.services.latency import LatencyProxy

    pids = [s.process.pid() for s in (CassandraServer.default(), S3Server.default(), LatencyProxy.default())]
    return [p for p in pids if p]
