"""Helpers for running the real Spark jobs (spark-submit, local master) in tests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from imgest.spark import submit_command, submit_env

MASTER = "local[2]"


def run_job(job: str, args: list[str], env: dict[str, str] | None = None, timeout: float = 300) -> tuple[int, str]:
    """Run jobs/JOB.py through spark-submit; returns (exit code, combined output)."""
    proc = subprocess.run(
        submit_command(job, args, MASTER),
        env={**submit_env(MASTER), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


def read_summary(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())
