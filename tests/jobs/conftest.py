"""Helpers for running the real Spark jobs (spark-submit, local master) in tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from imgest.spark import driver_server
from imgest.spark.submit import submit_command, submit_env

MASTER = "local[2]"
T = TypeVar("T")


def run_job(job: str, args: list[str], env: dict[str, str] | None = None, timeout: float = 300) -> tuple[int, str]:
    """Run jobs/JOB.py (in the suite's reused driver, else through spark-submit); returns (exit code, output)."""
    cmd = submit_command(job, args, MASTER)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "job.log"
        rc = driver_server.submit(cmd, out, env)
        if rc is not None:
            return rc, out.read_text()
    proc = subprocess.run(
        cmd,
        env={**submit_env(MASTER), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


def read_summary(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def kill_when(
    proc: subprocess.Popen[bytes], progress: Callable[[], T], enough: Callable[[T], bool], timeout: float = 180
) -> T:
    """Poll PROGRESS until ENOUGH, then SIGKILL PROC's process group (a real crash mid-job); returns the last value."""
    value = progress()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            value = progress()
            if enough(value):
                os.killpg(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return value
