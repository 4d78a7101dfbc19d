"""The check_datasets DAG as a factory: :func:`check_datasets_dag` builds it with the DAG id, tags and default
arguments a platform gives; dags/check_datasets.py calls it with the defaults.

Scheduled on the `imgest-datasets` alias, so every Asset a `refresh_<name>` or `ingest_imagenet` run (or a DAG their
factories built) publishes triggers it: for each new version it runs the DALI read-back throughput check of every
reader of its target (and the xNVMe validation for the files target) through the connections the publishing DAG
used (recorded in the Asset event), and records the reports with the version. Versions their producer already
checked (ingest_imagenet reads back inline) are skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import DAG

from imgest.operators.dag_connections import START_DATE, caller_file, dag_defaults
from imgest.operators.publish import DATASETS
from imgest.operators.refresh import CheckVersionsOperator


def check_datasets_dag(
    dag_id: str = "check_datasets",
    *,
    tags: Sequence[str] = ("imgest", "checks"),
    default_args: dict[str, Any] | None = None,
    max_active_runs: int = 4,
) -> DAG:
    """The DAG that checks each newly announced dataset version, under DAG_ID, with TAGS and DEFAULT_ARGS over
    imgest's (retries, a 6 h timeout)."""
    with DAG(
        dag_id=dag_id,
        description="Read-back and xNVMe checks of each newly published dataset version",
        doc_md=__doc__,
        schedule=[DATASETS],
        start_date=START_DATE,
        catchup=False,
        max_active_runs=max_active_runs,
        tags=list(tags),
        default_args=dag_defaults(6, default_args),
    ) as dag:
        dag.fileloc = caller_file()  # the DAG file that called the factory (caller_file says why)
        CheckVersionsOperator(task_id="check_versions", doc_md="Read back every announced version; record the reports.")
    return dag
