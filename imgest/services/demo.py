"""The README's first command: services up, then `ingest_imagenet` end to end for both targets."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

from imgest.core import workdir
from imgest.services import AirflowServer, CassandraServer, S3Server

log = logging.getLogger(__name__)
DEMO_RUNS = (
    ("cassandra", {"sample": True, "target": "cassandra", "dataset": "imagenet-sample", "keyspace": "imgest"}),
    (
        "shards",
        {"sample": True, "target": "shards", "dataset": "imagenet-sample", "s3_dest": "s3://imgest/imagenet-sample"},
    ),
)


def task_durations(airflow: AirflowServer, dag_id: str) -> list[tuple[str, str, float | None]]:
    """(task, state, seconds) of the latest run of DAG_ID, in execution order, from Airflow's metadata DB."""
    with sqlite3.connect(airflow.home / "airflow.db") as db:
        run = db.execute("SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1", (dag_id,)).fetchone()
        rows = db.execute(
            "SELECT task_id, state, start_date, end_date FROM task_instance WHERE dag_id = ? AND run_id = ?"
            " ORDER BY coalesce(start_date, '9999')",
            (dag_id, run[0]),
        ).fetchall()
    return [(task, state, _seconds(start, end)) for task, state, start, end in rows]


def task_results(airflow: AirflowServer, dag_id: str, task_ids: tuple[str, ...]) -> dict[str, Any]:
    """Return values (XCom) of TASK_IDS in the latest run of DAG_ID."""
    with sqlite3.connect(airflow.home / "airflow.db") as db:
        run = db.execute("SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1", (dag_id,)).fetchone()
        rows = db.execute(
            f"SELECT task_id, value FROM xcom WHERE dag_id = ? AND run_id = ? AND key = 'return_value'"
            f" AND task_id IN ({','.join('?' * len(task_ids))})",
            (dag_id, run[0], *task_ids),
        ).fetchall()
    return {task: json.loads(value) for task, value in rows}


def _seconds(start: str | None, end: str | None) -> float | None:
    from datetime import datetime

    if not start or not end:
        return None
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def run_dag(airflow: AirflowServer, conf: dict[str, Any]) -> tuple[bool, float, str]:
    """`airflow dags test ingest_imagenet` with CONF; returns (ok, seconds, output tail)."""
    t0 = time.monotonic()
    proc = airflow.airflow("dags", "test", "ingest_imagenet", "--conf", json.dumps(conf), check=False)
    return proc.returncode == 0, time.monotonic() - t0, (proc.stdout or "")[-3000:] + (proc.stderr or "")[-3000:]


def run_demo() -> int:
    """Start Cassandra and S3, prepare Airflow, run ingest_imagenet for both targets, report."""
    cassandra, s3, airflow = CassandraServer.default(), S3Server.default(), AirflowServer.default()
    for service in (cassandra, s3):
        print(service.up().message, flush=True)
    print(f"airflow home ready in {airflow.prepare(cassandra, s3):.1f}s: AIRFLOW_HOME={airflow.home}", flush=True)
    work = workdir.dataset_workdir("imagenet-sample")
    for target, conf in DEMO_RUNS:
        print(f"\n== airflow dags test ingest_imagenet --conf '{json.dumps(conf)}'", flush=True)
        ok, seconds, tail = run_dag(airflow, conf)
        print(f"{'success' if ok else 'FAILED'} in {seconds:.1f}s")
        for task, state, secs in task_durations(airflow, "ingest_imagenet"):
            print(f"  {task:<20} {state or '-':<10} {'' if secs is None else f'{secs:7.1f}s'}")
        if not ok:
            print(tail)
            return 1
        _report(target, work, cassandra, s3)
        results = task_results(airflow, "ingest_imagenet", (f"verify_{target}", "build_split", "read_throughput"))
        print(f"  verification: {json.dumps(results.get(f'verify_{target}'))}")
        print(f"  split file: {json.dumps(results.get('build_split'))}")
        read = results.get("read_throughput") or {}
        print(f"  DALI read-back (images/s, every byte verified): {json.dumps(read.get('readers'))}")
        print(f"  read-back report: {read.get('report')} (plot {read.get('plot')})")
    print("\nStop the services with: .venv/bin/imgest services down")
    return 0


def _report(target: str, work: Path, cassandra: CassandraServer, s3: S3Server) -> None:
    if target == "cassandra":
        summary = json.loads((work / workdir.CASSANDRA_SUMMARY).read_text())
        print(f"  data: Cassandra {cassandra.address}, tables {summary['tables']}, version {summary['version']}")
    else:
        summary = json.loads((work / workdir.SHARDS_SUMMARY).read_text())
        print(f"  data: {summary['dest']} ({summary['shards']} shards + manifest.json), S3 endpoint {s3.endpoint}")
    keys = ("stored", "skipped_already_committed", "samples", "quarantined", "quarantined_by_reason", "seconds")
    print("  summary: " + json.dumps({k: summary[k] for k in keys if k in summary}))
