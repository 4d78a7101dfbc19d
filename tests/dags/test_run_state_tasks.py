"""What an Airflow task of an imgest run does about the run's state and lock, with Airflow's own configuration and
connection lookup: the executor and spark_default decide where the state lives (a derived URL is exported for the
task), and a task whose run lost its dataset's lock fails without retries."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException

from imgest.core import locks
from imgest.core.errors import ConfigError
from imgest.operators.state import run_lease, task_deployment, use_run_state

SHARDS = {"sample": True, "target": "shards", "dataset": "imnet", "s3_dest": "s3://datasets/imnet"}


@pytest.fixture
def no_state_url(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("IMGEST_HOME", str(tmp_path))
    monkeypatch.setenv("IMGEST_STATE_URL", "")  # unset, and restored after the test whatever the task exported
    monkeypatch.setenv("IMGEST_LOCK_URL", "")


def _deploy(monkeypatch: pytest.MonkeyPatch, executor: str, master: str) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", executor)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": master}))


def test_celery_workers_keep_the_state_beside_the_destination(
    no_state_url: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _deploy(monkeypatch, "CeleryExecutor", "local[*]")
    assert task_deployment().executors() == ["CeleryExecutor"]
    assert use_run_state([SHARDS]) == "s3://datasets/_imgest-state"
    assert os.environ["IMGEST_STATE_URL"] == "s3://datasets/_imgest-state"  # for the lock store, work area, driver


def test_one_machine_keeps_its_state_and_the_lock_beside_the_destination(
    no_state_url: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On one machine the work stays local, but the lock of a dataset written to S3 lives beside it, where a CLI
    writer of the same destination looks for it too (one lock store for the CLI and every DAG)."""
    _deploy(monkeypatch, "LocalExecutor", "local[2]")
    assert use_run_state([SHARDS]) is None
    assert os.environ["IMGEST_STATE_URL"] == ""
    assert os.environ["IMGEST_LOCK_URL"] == "s3://datasets/_imgest-state"
    use_run_state([{"target": "files", "source": "/data/imagenet", "dataset": "imnet", "files_dest": "/srv/imnet"}])
    assert "IMGEST_LOCK_URL" not in os.environ  # no S3 destination, no tables: this machine's lock folder


def test_a_run_writing_cassandra_keeps_its_lock_in_the_keyspace(
    no_state_url: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run writing tables keeps its lock in their keyspace, on the cluster of the task's connection, where a CLI
    writing them looks too, whatever its state folder; a run writing both targets takes both locks, the keyspace's
    first (the order of their locations), as every writer does."""
    _deploy(monkeypatch, "LocalExecutor", "local[2]")
    monkeypatch.setenv("AIRFLOW_CONN_CASS_EU", json.dumps({"conn_type": "cassandra", "host": "10.0.0.5,10.0.0.6"}))
    tables = {"target": "cassandra", "source": "/data/imagenet", "dataset": "imnet", "keyspace": "vision"}
    use_run_state([tables], "cass_eu")
    keyspace = "cassandra://10.0.0.5,10.0.0.6:9042/vision?replication=SimpleStrategy%3A1"
    assert os.environ["IMGEST_LOCK_URL"] == keyspace
    monkeypatch.setenv("IMGEST_STATE_URL", "s3://state/imgest")  # the cluster's state store: the tables' lock stays
    use_run_state([tables], "cass_eu")
    assert os.environ["IMGEST_LOCK_URL"] == keyspace
    use_run_state([tables, SHARDS], "cass_eu")
    assert os.environ["IMGEST_LOCK_URL"] == f"{keyspace} | s3://state/imgest"


def test_a_cluster_master_without_s3_is_refused(no_state_url: None, monkeypatch: pytest.MonkeyPatch) -> None:
    _deploy(monkeypatch, "LocalExecutor", "spark://spark-master:7077")
    cassandra = {"target": "cassandra", "source": "/data/imagenet", "dataset": "imnet"}
    with pytest.raises(ConfigError, match=r"Spark master spark://spark-master:7077.*IMGEST_STATE_URL"):
        use_run_state([cassandra])


def _publish_twice_losing_the_lock_between() -> None:
    """A task of run manual__first (which took the lock) publishing, then publishing again after its lock was
    freed by hand and taken by run manual__second."""
    with run_lease("ingest_imagenet", "manual__first", "imnet"):
        locks.check_fence("imnet")  # held: the first publish passes
        assert locks.release("imnet")  # imgest locks release imnet
        other = locks.airflow_holder("ingest_imagenet", "manual__second")
        assert locks.try_acquire("imnet", other) is None
        locks.check_fence("imnet")


def test_a_task_whose_run_lost_the_lock_fails_without_retries(no_state_url: None) -> None:
    run = locks.airflow_holder("ingest_imagenet", "manual__first")
    assert locks.try_acquire("imnet", run) is None
    with pytest.raises(AirflowFailException) as failed:
        _publish_twice_losing_the_lock_between()
    assert "Airflow DAG ingest_imagenet run manual__first lost the write lock of dataset 'imnet'" in str(failed.value)
    assert "held by Airflow DAG ingest_imagenet run manual__second" in str(failed.value)
