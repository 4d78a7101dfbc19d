"""The job's wait for its command's scan (imgest.spark.scan_handoff), without Spark."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from imgest.spark.scan_handoff import ScanFailed, ScanHandoff, wait_for_scan


def test_the_job_goes_on_once_the_scan_is_done(tmp_path: Path) -> None:
    handoff = ScanHandoff(tmp_path / "w")
    threading.Timer(0.1, handoff.done).start()
    assert wait_for_scan(handoff.marker, poll_s=0.01) >= 0.05
    assert wait_for_scan(None) == 0.0  # no marker: the scan was done before the job started
    handoff.remove()
    assert list((tmp_path / "w").iterdir()) == []


def test_the_scans_error_reaches_the_job(tmp_path: Path) -> None:
    handoff = ScanHandoff(tmp_path)
    handoff.failed(ValueError("no label for n01/a.JPEG"))
    with pytest.raises(ScanFailed, match=r"the scan failed, so nothing was ingested: ValueError: no label for n01"):
        wait_for_scan(handoff.marker, poll_s=0.01)


def test_a_command_gone_before_its_scan_ended_stops_the_job(tmp_path: Path) -> None:
    handoff = ScanHandoff(tmp_path)
    pid = subprocess.Popen(["true"])  # a command that has exited
    pid.wait()
    handoff.marker.write_text(f"{pid.pid}\n")
    with pytest.raises(ScanFailed, match=rf"the command that started this job \(pid {pid.pid}\) ended"):
        wait_for_scan(handoff.marker, poll_s=0.01)
