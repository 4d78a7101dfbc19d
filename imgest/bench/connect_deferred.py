"""`imgest bench connect`'s third route: a Spark Connect job run deferrable (imgest.spark.detach), as a task with
``[imgest] spark_deferrable = 1`` runs it. Its client starts each Spark call and exits; this process follows the
operation as Airflow's triggerer would (not counted as the worker's); the client runs again and goes on. What the
worker carries is its clients' processes only: their CPU seconds, their peak RSS, and the seconds a client existed
(``worker_held_s``: a worker slot's time), beside the job's whole wall time."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from imgest.bench.measure import QuietWatch, RssSampler, TreeSampler, server_pids
from imgest.spark.detach import DETACH_ENV, DETACHED_EXIT, DONE_ENV, RUN_ENV
from imgest.spark.submit import submit_command

MAX_CLIENTS = 10  # a job with more Spark calls than this is not one of imgest's


def run_deferred(job: str, args: list[str], master: str, env: dict[str, str], log: Path) -> dict[str, Any]:
    """One job on the Connect MASTER, deferrable: wall, images/s over the wall, what its clients held."""
    from imgest.operators.connect_trigger import FAILED, follow_operation

    summary, detached = log.with_suffix(".json"), log.with_suffix(".detached.json")
    cmd = submit_command(job, [*args, "--summary-json", str(summary)], master)
    env = {**env, RUN_ENV: uuid.uuid4().hex[:20], DETACH_ENV: str(detached)}
    held = cpu_s = followed = 0.0
    peak, clients = 0, 0
    with QuietWatch(server_pids()) as quiet, open(log, "w") as out:
        t0 = time.perf_counter()
        while True:
            c0 = time.perf_counter()
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
            with TreeSampler([proc.pid]) as cpu, RssSampler(proc.pid, lambda *_: "worker") as rss:
                rc = proc.wait()
            held += time.perf_counter() - c0
            cpu_s += cpu.seconds()
            peak, clients = max(peak, rss.peaks.total.get("worker", 0)), clients + 1
            if rc != DETACHED_EXIT or clients > MAX_CLIENTS:
                break
            record = json.loads(detached.read_text())
            f0 = time.perf_counter()
            event = follow_operation(master, record, None, threading.Event())
            followed += time.perf_counter() - f0
            if event["status"] == FAILED:
                raise RuntimeError(f"{job} failed on Spark: {event.get('error')}; log {log}")
            env[DONE_ENV] = json.dumps({**event, "call": record["call"], "operation_id": record["operation_id"]})
        wall = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"{job} on {master} (deferrable) failed (exit {rc}) after {clients} clients; log {log}")
    done = json.loads(summary.read_text())
    images = done["stored"] if "stored" in done else sum(done["samples"].values())
    return {
        "wall_s": round(wall, 2),
        "job_s": round(wall, 2),  # the job as its DAG sees it: its last client's own seconds are only its tail
        "images": images,
        "images_per_s": round(images / wall, 1),
        "worker_cpu_s": round(cpu_s, 2),
        "worker_cores": round(cpu_s / wall, 3),
        "worker_peak_rss_mb": round(peak / 2**20, 1),
        "worker_held_s": round(held, 2),
        "clients": clients,
        "followed_s": round(followed, 2),  # the triggerer's wait, no worker process meanwhile
        "quiet": quiet.result.to_dict(),
    }
