"""The Spark Connect route's launcher: the job as its own __main__, Arrow's system pool chosen before pyarrow loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from imgest.spark.submit import connect_command, run_submit

JOB = """
import json, os, sys
import pyarrow as pa
print(json.dumps({"pool": pa.default_memory_pool().backend_name, "argv": sys.argv, "path0": sys.path[0],
                  "name": __name__, "env": os.environ.get("ARROW_DEFAULT_MEMORY_POOL")}))
sys.exit(int(sys.argv[-1]))
"""


def _launch(job: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("ARROW_DEFAULT_MEMORY_POOL", "MALLOC_TRIM_THRESHOLD_")}
    cmd = [sys.executable, "-m", "imgest.spark.thin_client", str(job), *args]
    return subprocess.run(cmd, env={**base, **(env or {})}, capture_output=True, text=True, cwd="/", check=False)


def test_connect_command_runs_the_job_through_the_launcher() -> None:
    cmd = connect_command("pack_shards", ["--dest", "x"], "sc://spark.example:15002")
    assert cmd[:3] == [sys.executable, "-m", "imgest.spark.thin_client"]
    assert cmd[3].endswith("pack_shards.py")
    assert Path(cmd[3]).is_file()
    assert cmd[4:] == ["--spark-remote", "sc://spark.example:15002", "--dest", "x"]


def test_the_job_runs_as_main_with_the_system_pool(tmp_path: Path) -> None:
    job = tmp_path / "jobs" / "probe.py"
    job.parent.mkdir()
    job.write_text(JOB)
    done = _launch(job, "--flag", "3")
    assert done.returncode == 3, done.stderr  # the job's exit is the process's
    seen = json.loads(done.stdout)
    assert seen == {"pool": "system", "argv": [str(job), "--flag", "3"], "path0": str(job.parent), "name": "__main__",
                    "env": "system"}  # fmt: skip


def test_a_pool_the_user_chose_wins(tmp_path: Path) -> None:
    job = tmp_path / "probe.py"
    job.write_text(JOB)
    done = _launch(job, "0", env={"ARROW_DEFAULT_MEMORY_POOL": "mimalloc"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["pool"] == "mimalloc"


def test_too_late_is_an_error_not_a_silent_no_op() -> None:
    code = "import pyarrow; from imgest.spark.driver_memory import lean_allocators; lean_allocators()"
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert "before pyarrow is imported" in done.stderr


def test_no_script_says_so(tmp_path: Path) -> None:
    done = _launch(tmp_path / "absent.py")
    assert done.returncode == 1
    assert "no job script at" in done.stderr


def test_run_submit_treats_the_launched_job_as_connect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """run_submit finds the Connect option in the launcher's longer argv: the job runs as the thin client (here a
    script that exits at once), never handed to spark-submit's reused driver."""
    from imgest.spark import driver_server

    handed: list[list[str]] = []

    def reused_driver(cmd: list[str], log_file: Path, *_: object) -> int:
        handed.append(cmd)
        log_file.write_text("")
        return 99

    monkeypatch.setattr(driver_server, "submit", reused_driver)
    job = tmp_path / "probe.py"
    job.write_text(JOB)
    cmd = [sys.executable, "-m", "imgest.spark.thin_client", str(job), "--spark-remote", "sc://x:1", "5"]
    assert run_submit(cmd, tmp_path / "log.txt") == 5
    assert handed == []  # read as spark-submit, it would have gone to the reused driver (and returned 99)
    assert '"pool": "system"' in (tmp_path / "log.txt").read_text()
    spark_submit = ["spark-submit", "--master", "local[*]", "--name", "imgest-probe", str(job), "5"]
    assert run_submit(spark_submit, tmp_path / "log2.txt") == 99  # the same check sends spark-submit's there
    assert handed == [spark_submit]
