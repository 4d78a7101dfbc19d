"""Spark submitting tasks take their pool from $IMGEST_SPARK_POOL: imgest's Airflow homes set `spark` (created with
the connections); unset, Airflow's default_pool, so no task waits forever on a pool that does not exist."""

from __future__ import annotations

import pytest

from imgest.services.airflow import SPARK_POOL, AirflowServer


def test_pool_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    from imgest.operators.spark import CassandraIngestSubmitOperator, PackShardsSubmitOperator

    monkeypatch.delenv("IMGEST_SPARK_POOL", raising=False)
    assert PackShardsSubmitOperator(task_id="a").pool == "default_pool"
    monkeypatch.setenv("IMGEST_SPARK_POOL", "spark")
    assert CassandraIngestSubmitOperator(task_id="b").pool == "spark"
    assert PackShardsSubmitOperator(task_id="c", pool="other").pool == "other"  # a DAG's own choice wins


def test_imgest_homes_name_the_pool_they_create(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    from pathlib import Path

    monkeypatch.delenv("IMGEST_SPARK_POOL", raising=False)
    assert AirflowServer(home=Path(str(tmp_path))).env()["IMGEST_SPARK_POOL"] == SPARK_POOL == "spark"
