"""Run one epoch of a reading pipeline, time it, and prove what it read.

Every sample a pipeline returns is identified (by id), its label compared with the one recorded at ingest and
its encoded bytes hashed against the recorded sha256; each id must come exactly once per epoch and every
id of the ReadSet (the checked sample, or every row) must come, unless a time budget stopped the epoch
(``imgest.readback.budget``: then the ids not read are counted as ``unread``); the bookkeeping is numpy columns.
The figures: the reader's start-up (to its first batch, its pipeline's build included) apart from its steady rate
(the images after its warm-up batches over their time; a throughput only over its window: ``steady``), images/s,
MB/s, p50/p99 batch latency and CPU cores used by the process; and the epoch rate the way the
cassandra-dali-plugin's paper states it, the harmonic mean of the batch rates (each batch's images over the time
its ``run()`` took), which leaves out the verification done between batches. With ``verify_after`` the loop
keeps each sample's bytes and verifies them after the epoch, so the reader's threads do not get the verification
time to read ahead in (the benchmarks: the plugin's timing loop does nothing but run the pipeline).
"""

from __future__ import annotations

import hashlib
import resource
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from imgest.core.sampling import IdIndex
from imgest.readback.budget import ReaderBudget, ReadPlan, least_window
from imgest.readback.pipelines import READER

if TYPE_CHECKING:
    from imgest.readback.datasets import ReadSet

# (id, label, expected sha256 or None when the expected value comes with the sample) for each output sample
Identify = Callable[[tuple[Any, ...], int], tuple[str, int, str | None]]


@dataclass
class RunResult:
    """One reader, one mode, one epoch."""

    reader: str
    mode: str
    device: str
    images: int = 0
    bytes: int = 0
    seconds: float = 0.0
    images_per_s: float = 0.0  # images over the epoch's wall time (verification included)
    epoch_rate: float = 0.0  # harmonic mean of the batch rates (images/s), the benchmark's figure
    second_half_rate: float = 0.0  # the same over the epoch's second half only (the latency sweep's late figure)
    first_batch_ms: float = 0.0  # the epoch's first run(): what a training loop waits for at the epoch's start
    startup_s: float = 0.0  # from the reader's start (its pipeline's build included) to its first batch
    warmup_s: float = 0.0  # ... to the end of its warm-up batches
    teardown_s: float = 0.0  # after its last batch, its pipelines' deletion (DALI waits for their prefetched reads)
    warmup_batches: int = 0
    steady_batches: int = 0  # batches after the warm-up: what its steady rate spans
    steady_images: int = 0
    steady_s: float = 0.0  # seconds the batches after the warm-up span
    least_window_s: float = 0.0  # ... at least, for its rate to be a throughput (or its sample read; a budget's)
    steady_rate: float = 0.0  # images/s after its warm-up (wall time, verification included): its throughput
    steady: bool = False  # the steady rate spans the window (imgest.readback.budget); False: not a throughput
    rate_note: str = ""  # why the steady rate is not a throughput ('' when it is)
    passes: int = 1  # reads of its whole sample (imgest.readback.passes: one that ended under its least window)
    mb_per_s: float = 0.0
    batch_ms_p50: float = 0.0
    batch_ms_p99: float = 0.0
    cpu_cores: float = 0.0
    cores_per_1k: float = 0.0  # CPU cores of the process per 1,000 images/s of epoch rate
    images_verified: int = 0  # distinct images of the ReadSet read and checked (equals images when ok)
    budget_s: float = 0.0  # its share of the check's time budget (imgest.readback.budget); 0: no budget
    budget_cut: bool = False  # it stopped before the end of its sample
    stop: str = ""  # why it stopped (imgest.readback.budget: sample read, rate steady, share spent, ...)
    unread: int = 0  # images of the sample it did not read
    reason: str = ""  # why it stopped before the end of its sample ('' when it did not)
    batch_ends: list[float] = field(default_factory=list)  # each batch's end, seconds from the epoch loop's start
    batch_images: list[int] = field(default_factory=list)  # each batch's images
    note: str = ""  # a known limit of this reader that its rate shows (the report and the log say it)
    ok: bool = True
    problems: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Verifier:
    """Checks ids, labels and hashes of every sample of one epoch against a ReadSet's columns."""

    MAX_PROBLEMS = 100  # problems listed in full; the rest are counted

    def __init__(self, rs: ReadSet) -> None:
        self.rs, self.index = rs, IdIndex(rs.ids)
        self.seen = np.zeros(len(rs), bool)
        self.problems: list[str] = []
        self.more = 0
        self.partial = False  # a budget stopped the epoch: the ids not read are counted, not missing

    def _problem(self, text: str) -> None:
        if len(self.problems) < self.MAX_PROBLEMS:
            self.problems.append(text)
        else:
            self.more += 1

    def check(self, key: str, label: int, data: np.ndarray, sha256: str | None) -> None:
        i = self.index.find(key)
        if i < 0:
            self._problem(f"{key}: not part of the dataset version (or not in the checked sample)")
            return
        if self.seen[i]:
            self._problem(f"{key}: read twice in one epoch")
        self.seen[i] = True
        want = int(self.rs.labels[i])
        if label != want:
            self._problem(f"{key}: label {label}, recorded {want}")
        recorded = self.rs.rows["sha256"][i].tobytes().hex() if self.rs.rows["recorded"][i] else sha256
        actual = hashlib.sha256(data.tobytes()).hexdigest()
        if recorded is None:
            self._problem(f"{key}: no sha256 recorded at ingest")
        elif actual != recorded:
            self._problem(f"{key}: sha256 {actual[:12]}..., recorded {recorded[:12]}...")

    def finish(self) -> list[str]:
        missing = np.flatnonzero(~self.seen)
        if len(missing) and not self.partial:
            some = [self.rs.ids[j].decode() for j in missing[:5]]
            self._problem(f"{len(missing)} ids never read, e.g. {', '.join(some)}")
        if self.more:
            self.problems.append(f"... and {self.more} more problems")
        return self.problems


def epoch_batches(pipe: Any, total: int | None) -> Iterator[tuple[tuple[Any, ...], int, float]]:
    """(outputs, valid samples, seconds in run()) for one epoch of PIPE (padding of named readers dropped)."""
    if total is None:
        total = pipe.epoch_size(READER)
    left = total
    while left > 0:
        t0 = time.perf_counter()
        try:
            out = pipe.run()
        except StopIteration:
            break
        dt = time.perf_counter() - t0
        n = min(len(out[0]), left)
        left -= n
        yield out, n, dt


def measure(
    name: str,
    pipe: Any,
    mode: str,
    rs: ReadSet,
    identify: Identify,
    total: int | None = None,
    settings: dict[str, Any] | None = None,
    on_batch: Callable[[int], None] | None = None,
    verify_after: bool = False,
    verifier: Verifier | None = None,
    budget: ReaderBudget | None = None,
    started: float | None = None,
    least: float | None = None,
) -> RunResult:
    """Run one epoch of PIPE, verifying every sample against RS (with VERIFIER, by default a Verifier by id); the
    wall figures include the verification (equal for all), the epoch rate does not. VERIFY_AFTER: verify after the
    epoch (the epoch's bytes held in memory). BUDGET: stop where its time runs out (imgest.readback.budget); every
    sample read is still verified, and the result says how much of RS was read and why. STARTED: when the reader
    started (``time.perf_counter()`` before its pipeline was built), from which its start-up is counted. LEAST: the
    seconds its measured batches span at least (budget.least_window of NAME and MODE where None)."""
    jpeg_at = 0 if mode == "raw" else 2
    verifier = verifier or Verifier(rs)
    result = RunResult(name, mode, "cpu" if pipe.device_id is None else "gpu", settings=settings or {})
    latencies: list[tuple[int, float]] = []  # (images, seconds in run()) per batch
    held: list[tuple[str, int, np.ndarray, str | None]] = []
    usage0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    plan = ReadPlan(budget, len(rs), t0, started, least_window(name, mode) if least is None else least)
    for out, n, dt in epoch_batches(pipe, total):
        latencies.append((n, dt))
        for i in range(n):
            key, label, sha = identify(out, i)
            data = out[jpeg_at].at(i)
            if verify_after:
                held.append((key, label, data, sha))
            else:
                verifier.check(key, label, data, sha)
            result.bytes += data.nbytes
        result.images += n
        if on_batch:
            on_batch(n)
        if not plan.more(n):
            break
    result.seconds = time.perf_counter() - t0
    usage1 = resource.getrusage(resource.RUSAGE_SELF)
    for key, label, data, sha in held:
        verifier.check(key, label, data, sha)
    verifier.partial = plan.cut
    result.images_verified = int(verifier.seen.sum())
    result.problems = verifier.finish()
    result.ok = not result.problems
    for field_name, value in plan.fields().items():
        setattr(result, field_name, value)
    result.batch_ends = [round(end - t0, 5) for _, end in plan.batches]
    result.batch_images = [n for n, _ in plan.batches]
    cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    _figures(result, latencies, cpu)
    return result


def _figures(result: RunResult, batches: list[tuple[int, float]], cpu: float) -> None:
    """RESULT's rates, latencies and CPU figures from its BATCHES (images, seconds in run()) and CPU seconds."""
    latencies = [dt for _, dt in batches]
    rates = [n / max(dt, 1e-9) for n, dt in batches]
    result.images_per_s = round(result.images / result.seconds, 1) if result.seconds else 0.0
    result.mb_per_s = round(result.bytes / 1e6 / result.seconds, 2) if result.seconds else 0.0
    if latencies:
        result.first_batch_ms = round(latencies[0] * 1000, 2)
        result.batch_ms_p50 = round(float(np.percentile(latencies, 50)) * 1000, 2)
        result.batch_ms_p99 = round(float(np.percentile(latencies, 99)) * 1000, 2)
    result.cpu_cores = round(cpu / result.seconds, 2) if result.seconds else 0.0
    if rates:
        result.epoch_rate = round(statistics.harmonic_mean(rates), 1)
        result.second_half_rate = round(statistics.harmonic_mean(rates[len(rates) // 2 :]), 1)
        result.cores_per_1k = round(result.cpu_cores / (result.epoch_rate / 1000), 3) if result.epoch_rate else 0.0
    result.seconds = round(result.seconds, 3)
