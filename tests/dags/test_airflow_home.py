"""A prepared AIRFLOW_HOME is reused: no `airflow db migrate` or connection import until what it holds changes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from imgest.services import AirflowServer, CassandraServer, S3Server
from imgest.services.airflow import PREPARED


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """Record every `airflow` command AirflowServer runs (each still runs for real)."""
    calls: list[tuple[str, ...]] = []
    real = AirflowServer.airflow

    def airflow(self: AirflowServer, *args: str, **kwargs: Any) -> Any:
        calls.append(args)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(AirflowServer, "airflow", airflow)
    return calls


def test_prepare_skips_migrate_and_import_until_the_stamp_differs(
    airflow_home: AirflowServer, cassandra_server: CassandraServer, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _spy(monkeypatch)
    stamp = json.loads((airflow_home.home / PREPARED).read_text())
    assert set(stamp) == {"airflow", "connections", "pools"}
    airflow_home.prepare(cassandra_server, s3_server)
    assert calls == []  # prepared by the fixture with the same connections: nothing to do

    (airflow_home.home / PREPARED).write_text(json.dumps({**stamp, "connections": "other"}))
    airflow_home.prepare(cassandra_server, s3_server)
    assert [c[:2] for c in calls] == [("db", "migrate"), ("connections", "import"), ("pools", "set")]
    assert json.loads((airflow_home.home / PREPARED).read_text()) == stamp


def test_no_deprecation_warning_from_our_config_or_dags(airflow_home: AirflowServer, tmp_path: Path) -> None:
    """Airflow 3 as it is meant to be used: the written airflow.cfg uses no moved option and parsing imgest's DAGs
    (operators, hooks, task hooks) raises no DeprecationWarning, with every warning shown."""
    import subprocess
    import sys

    from imgest.core.paths import dags_dir

    env = {**airflow_home.env(), "PYTHONWARNINGS": "always::DeprecationWarning,always::PendingDeprecationWarning"}
    cli = subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "dags", "list-import-errors"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    out = cli.stdout + cli.stderr
    assert cli.returncode == 0, out
    parse = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("dagbag_report.py")), str(dags_dir()), str(tmp_path / "r.json")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    out += parse.stdout + parse.stderr
    assert parse.returncode == 0, out
    assert json.loads((tmp_path / "r.json").read_text())["import_errors"] == {}
    warnings = [line for line in out.splitlines() if "Deprecat" in line or "has been moved" in line]
    assert warnings == []


def test_scheduler_beats_reads_the_running_scheduler_job(airflow_home: AirflowServer, tmp_path: Path) -> None:
    """`up` waits for the scheduler's beat: `airflow standalone` keeps serving the UI when its scheduler died at
    start (CI: "database is locked" on its first write), and a run's Asset events then trigger nothing."""
    import sqlite3
    from datetime import UTC, datetime, timedelta

    home = tmp_path / "home"
    home.mkdir()
    with sqlite3.connect(airflow_home.home / "airflow.db") as src, sqlite3.connect(home / "airflow.db") as copy:
        src.backup(copy)  # the migrated schema, not the fixture's DB (which other tests write meanwhile)
    server = AirflowServer(home=home)
    assert not server.scheduler_beats(60)

    def beat(age_s: float, state: str = "running") -> None:
        when = (datetime.now(UTC) - timedelta(seconds=age_s)).replace(tzinfo=None).isoformat(" ")
        with sqlite3.connect(home / "airflow.db") as db:
            db.execute("DELETE FROM job")
            db.execute(
                "INSERT INTO job (job_type, state, start_date, latest_heartbeat, hostname, unixname) "
                "VALUES ('SchedulerJob', ?, ?, ?, 'h', 'u')",
                (state, when, when),
            )

    beat(120)
    assert not server.scheduler_beats(60)  # a scheduler that died two minutes ago
    beat(2)
    assert server.scheduler_beats(60)
    beat(2, "failed")
    assert not server.scheduler_beats(60)
    # The busy wait the DB's writers use (pysqlite's 5 s once killed the scheduler at start).
    got = airflow_home.airflow("config", "get-value", "database", "sql_alchemy_connect_args")
    assert got.stdout.strip() == "imgest.services.airflow_sqlite.CONNECT_ARGS"
