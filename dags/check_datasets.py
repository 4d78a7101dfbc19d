"""check_datasets: runs when a dataset version is announced (an Asset event through `imgest-datasets`).

Scheduled on the `imgest-datasets` alias, so every Asset a `refresh_<name>` (or `ingest_imagenet`) run
publishes triggers it: for each new version it runs the DALI read-back throughput check of every reader of
its target (and the xNVMe validation for the files target) and records the reports with the version
(`dataset_versions.checks` for Cassandra, `manifest.json` `checks` for shards). Versions that their producer
already checked (ingest_imagenet reads back inline) are skipped.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from imgest.operators.publish import DATASETS
from imgest.operators.refresh import CheckVersionsOperator

with DAG(
    dag_id="check_datasets",
    description="Read-back and xNVMe checks of each newly published dataset version",
    doc_md=__doc__,
    schedule=[DATASETS],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=4,
    tags=["imgest", "checks"],
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30), "execution_timeout": timedelta(hours=6)},
) as dag:
    CheckVersionsOperator(task_id="check_versions", doc_md="Read back every announced version; record the reports.")
