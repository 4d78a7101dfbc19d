"""Smoke DAG: a blob through Cassandra and an object through S3, each read back and compared."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from imgest.operators.smoke import CassandraRoundTripOperator, S3RoundTripOperator

with DAG(
    dag_id="smoke_services",
    description="Round-trip bytes through the Cassandra and S3 connections",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["imgest", "smoke"],
    default_args={"retries": 2, "retry_delay": timedelta(seconds=10)},
    params={
        "nbytes": Param(1 << 20, type="integer", minimum=1, maximum=16 << 20, title="Bytes per round-trip"),
        "bucket": Param("imgest", type="string", title="S3 bucket"),
    },
) as dag:
    CassandraRoundTripOperator(task_id="cassandra_roundtrip", nbytes="{{ params.nbytes }}")
    S3RoundTripOperator(task_id="s3_roundtrip", bucket="{{ params.bucket }}", nbytes="{{ params.nbytes }}")
