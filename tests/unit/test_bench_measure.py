"""The benchmarks' one harness (imgest.bench.measure): spread, target checks, the peak RSS of a process tree."""

from __future__ import annotations

import subprocess
import sys

from imgest.bench.measure import Peaks, RssSampler, meets, spread

# a child that holds 200 MiB of touched memory for a moment
HOLD = "import time\nb = bytearray(200 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\ntime.sleep(1.5)\n"


def test_spread_and_target_checks() -> None:
    assert spread([3.0, 1.0, 2.0, 10.0]) == {"median": 2.5, "min": 1.0, "max": 10.0}
    assert meets(2.0, None) is None
    assert meets(2.0, 2.0) is True
    assert meets(1.99, 2.0) is False
    assert meets(0.5, 0.5, at_most=True) is True
    assert meets(0.51, 0.5, at_most=True) is False


def test_rss_sampler_sees_a_childs_peak_under_its_role() -> None:
    proc = subprocess.Popen([sys.executable, "-c", HOLD])
    with RssSampler(proc.pid, lambda cmd, root, pid: "child" if pid == root else None, interval=0.05) as sampler:
        proc.wait(timeout=60)
    assert proc.returncode == 0
    assert 200 << 20 <= sampler.peaks.single["child"] < 400 << 20
    assert sampler.peaks.total["child"] == sampler.peaks.single["child"]  # one process of the role


def test_peaks_ignore_a_role_whose_only_process_went_away() -> None:
    """A process that exits between its role and its RSS adds nothing (the sampler's thread once died on it)."""
    peaks = Peaks()
    peaks.add({"python": [], "jvm": [5, 7]})
    peaks.add({"jvm": [3]})
    assert peaks.single == {"jvm": 7}
    assert peaks.total == {"jvm": 12}
