"""`airflow dags test smoke_services` against the real Cassandra and S3 connections."""

from __future__ import annotations

import sqlite3

import pytest

from imgest.services import AirflowServer

pytestmark = pytest.mark.services


def test_smoke_dag_succeeds(airflow_home: AirflowServer) -> None:
    proc = airflow_home.airflow("dags", "test", "smoke_services", "--conf", '{"nbytes": 3145728}', check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with sqlite3.connect(airflow_home.home / "airflow.db") as db:
        run_id, state = db.execute(
            "SELECT run_id, state FROM dag_run WHERE dag_id = 'smoke_services' ORDER BY id DESC LIMIT 1"
        ).fetchone()
        tasks = dict(
            db.execute(
                "SELECT task_id, state FROM task_instance WHERE dag_id = 'smoke_services' AND run_id = ?",
                (run_id,),
            ).fetchall()
        )
    assert state == "success"
    assert tasks == {"cassandra_roundtrip": "success", "s3_roundtrip": "success"}
