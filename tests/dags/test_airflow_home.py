"""A prepared AIRFLOW_HOME is reused: no `airflow db migrate` or connection import until what it holds changes."""

from __future__ import annotations

import json
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
    assert set(stamp) == {"airflow", "connections"}
    airflow_home.prepare(cassandra_server, s3_server)
    assert calls == []  # prepared by the fixture with the same connections: nothing to do

    (airflow_home.home / PREPARED).write_text(json.dumps({**stamp, "connections": "other"}))
    airflow_home.prepare(cassandra_server, s3_server)
    assert [c[:2] for c in calls] == [("db", "migrate"), ("connections", "import")]
    assert json.loads((airflow_home.home / PREPARED).read_text()) == stamp
