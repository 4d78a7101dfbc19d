"""One step of `imgest bench scale` in a process of its own (`imgest.bench.scale_step`), its process tree and the
embedded servers sampled for peak RSS per role (imgest.bench.measure.RssSampler); the helpers both the ingest and
the refresh paths use."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from imgest.bench.measure import RssSampler
from imgest.spark.pypath import DAEMON_MODULE

STEPS = {
    "cassandra": (
        "scan",
        "prepare_cassandra",
        "ingest_cassandra",
        "verify_cassandra",
        "build_split",
        "read_throughput",
    ),
    "shards": ("scan", "prepare_bucket", "ingest_shards", "verify_shards", "build_split", "read_throughput"),
}


# task: the step's own process (the Airflow task or CLI); spark_driver: spark-submit's JVM (in local mode the
# executors are its threads); driver_python: the job's Python driver (jobs/*.py); spark_worker: a Python worker.
ROLES = ("task", "spark_driver", "driver_python", "spark_worker", "cassandra_server", "s3_server")


PIPELINE_ROLES = ("task", "spark_driver", "driver_python", "spark_worker")


def role_of(cmdline: list[str], root_pid: int, pid: int) -> str | None:
    """Which part of the pipeline the process with CMDLINE is (None: not one we measure)."""
    text = " ".join(cmdline)
    if pid == root_pid:
        return "task"
    if "org.apache.spark.deploy.SparkSubmit" in text:
        return "spark_driver"
    if any(part.endswith(".py") and "/jobs/" in part for part in cmdline[1:4]):  # python JOB.py, or the thin client
        return "driver_python"
    if any(name in text for name in ("pyspark.daemon", "pyspark.worker", "pyspark/daemon", DAEMON_MODULE)):
        return "spark_worker"
    if "CassandraDaemon" in text:
        return "cassandra_server"
    if "weed" in text and " mini" in text:
        return "s3_server"
    return None


def embedded_servers() -> list[Any]:
    """The running Cassandra and SeaweedFS servers (psutil processes), found by their command lines."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if role_of(proc.info["cmdline"] or [], -1, proc.pid) in ("cassandra_server", "s3_server"):
            found.append(proc)
    return found


def run_step(step: str, state_file: Path, log_file: Path) -> dict[str, Any]:
    """Run STEP in its own process; wall time, peak RSS per role (the step process's own from the kernel)."""
    cmd = [sys.executable, "-m", "imgest.bench.scale_step", step, str(state_file)]
    start = time.perf_counter()
    with open(log_file, "a") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        with RssSampler(proc.pid, role_of, embedded_servers()) as sampler:
            _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"step {step} failed (exit {proc.returncode}); log: {log_file}")
    hwm = state_file.parent / f"step-{step}.hwm"  # the step process's own peak (scale_step.own_peak_rss)
    if hwm.is_file():
        sampler.peaks.single["task"] = max(sampler.peaks.single.get("task", 0), int(hwm.read_text()))
    result = json.loads((state_file.parent / f"step-{step}.json").read_text())
    load = [round(x, 2) for x in os.getloadavg()]  # other work on the machine shows here (1, 5, 15 min)
    return {
        "step": step,
        "wall_s": round(wall, 2),
        "rss": sampler.peaks.single,
        "rss_sum": sampler.peaks.total,
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),  # the step's process tree (reaped children included)
        "load_after": load,
        "result": result,
    }


def reset_dataset(dataset: str, keyspace: str, dest: str) -> None:
    """Drop what an earlier run of this benchmark stored for DATASET: every size starts from empty."""
    from imgest.core.s3_prefix import delete_prefix
    from imgest.core.settings import CassandraSettings, S3Settings
    from imgest.core.workdir import dataset_workdir
    from imgest.sinks.cassandra.client import cassandra_session

    shutil.rmtree(dataset_workdir(dataset), ignore_errors=True)
    with cassandra_session(CassandraSettings.from_env()) as session:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=600)
    bucket, _, prefix = dest.removeprefix("s3://").partition("/")
    delete_prefix(S3Settings.from_env().client(), bucket, prefix.rstrip("/") + "/")


def stored_bytes(result: dict[str, Any]) -> int | None:
    """Bytes the ingest stored (image bytes, from the job's summary)."""
    for key in ("stored_bytes", "bytes", "shard_bytes", "bytes_written"):
        if isinstance(result.get(key), int):
            return int(result[key])
    return None


def peak(row: dict[str, Any]) -> int:
    return max(row["rss"].get(r, 0) for r in PIPELINE_ROLES)


def peak_role(row: dict[str, Any]) -> str:
    return max(PIPELINE_ROLES, key=lambda r: row["rss"].get(r, 0))
