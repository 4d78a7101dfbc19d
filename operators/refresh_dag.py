"""The refresh DAG of one datasets-file entry as a factory: :func:`build_refresh_dag` builds ``refresh_<name>`` with
the DAG id, connection ids, Spark pool, tags and default arguments a platform gives; dags/refresh_datasets.py calls
it for every entry of ``$IMGEST_DATASETS_FILE`` with the defaults.

Each run takes the dataset's write lock, scans the source again and, per target, compares with the last complete
version: no change, no Spark job and no new version; otherwise the added and changed images are ingested, removed
ones deleted (Cassandra) or marked dead in their kept shards (shards), the new version verified and announced as an
Asset, which triggers ``check_datasets``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import DAG, TaskGroup, task

from imgest.flow.registry import DatasetEntry
from imgest.operators.cassandra import ApplyCqlSchemaOperator
from imgest.operators.config_options import export_section
from imgest.operators.dag_connections import DEFAULT, START_DATE, DagConnections, caller_file, dag_defaults
from imgest.operators.dataset_lock import DatasetLockOperator
from imgest.operators.publish import DATASETS, MANIFEST_DIR, SOURCE_CONN, announce
from imgest.operators.refresh import FinishRefreshOperator
from imgest.operators.s3 import CollectGarbageOperator, EnsureBucketOperator
from imgest.operators.spark import CassandraIngestSubmitOperator, PackShardsSubmitOperator, VerifyShardsSubmitOperator
from imgest.operators.workarea import work_hooks


def _doc(entry: DatasetEntry) -> str:
    targets = ", ".join(entry.targets)
    return (
        f"### Refresh `{entry.name}`\n\n{entry.description}\n\nSchedule `{entry.schedule}`, targets {targets}, "
        f"settings `{entry.settings}` (from the datasets file). Each run ingests only what changed since the last "
        "complete version; a run that finds no change starts no Spark job and records no version."
    )


def _target_group(entry: DatasetEntry, target: str, scanned: Any, conns: DagConnections, spark: dict[str, Any]) -> Any:
    """plan -> changed? -> prepare -> ingest (Spark) -> finish -> publish, for one target; shards: ingest -> verify
    (Spark: the new shards hashed on the executors) -> finish, and publish -> gc."""
    conf = entry.conf(target)
    plan_args = "{{ ti.xcom_pull(task_ids='" + target + ".plan')['job_args'] }}"

    @task(task_id="plan", doc_md="Scan vs the last complete version: added, changed, removed, unchanged.")
    def plan(scan_result: dict[str, Any]) -> dict[str, Any]:
        from imgest.operators.refresh import plan_target

        return plan_target(conf, scan_result["manifest_dir"], conns.cassandra)

    @task.short_circuit(
        task_id="changed",
        ignore_downstream_trigger_rules=False,
        doc_md="No change: the rest of this target is skipped (no Spark job).",
    )
    def changed(result: dict[str, Any]) -> bool:
        return bool(result["changed"])

    @task(task_id="publish", outlets=[DATASETS], doc_md="Announces the new version as an Asset.")
    def publish(result: dict[str, Any], *, outlet_events: Any = None) -> str:
        extra = {"dataset": entry.name, "target": target, "version": result["version"], "conf": conf}
        return announce(conf, {**extra, "changes": result["counts"]}, outlet_events, conns)

    with TaskGroup(target):
        planned = plan(scanned)
        job = {"task_id": "ingest", "application_args": plan_args, "source_conn_id": SOURCE_CONN}
        finish = _write_and_finish(entry, target, conf, changed(planned), job, spark)
        last = publish(finish.output)
        if target == "shards":
            gc = CollectGarbageOperator(
                task_id="gc",
                request=conf,
                manifest_dir=MANIFEST_DIR,
                doc_md="Deletes the shard versions older than the published one and keep_versions before it (the "
                "datasets file's setting, default 1); never what manifest.json names. Returns what it removed.",
            )
            last >> gc
            last = gc
    return last


def _write_and_finish(
    entry: DatasetEntry, target: str, conf: dict[str, Any], after: Any, job: dict[str, Any], spark: dict[str, Any]
) -> Any:
    """AFTER >> prepare >> ingest (the Spark JOB, on SPARK's connection and pool) >> finish, shards with their verify
    job before finish; returns finish."""
    if target == "cassandra":
        prepare = ApplyCqlSchemaOperator(task_id="prepare", request=conf, manifest_dir=MANIFEST_DIR)
        ingest = CassandraIngestSubmitOperator(**job, **spark, lock_dataset=entry.name)
        finish = FinishRefreshOperator(task_id="finish", request=conf, out_dir=MANIFEST_DIR)
        after >> prepare >> ingest >> finish
        return finish
    from imgest.flow.request import IngestRequest

    dest = IngestRequest.from_conf(conf).shard_dest
    prepare = EnsureBucketOperator(task_id="prepare", dest=dest)
    ingest = PackShardsSubmitOperator(**job, **spark, lock_dataset=entry.name)
    verify = VerifyShardsSubmitOperator(
        task_id="verify",
        application_args=["--dest", dest, "--no-hash-kept"],
        lock_dataset=entry.name,
        doc_md="Spark job `jobs/verify_shards.py`: the executors hash the new shards (the kept ones: size and "
        "sidecars) against the new manifest.json, before the baseline moves.",
        **spark,
    )
    finish = FinishRefreshOperator(task_id="finish", request=conf, out_dir=MANIFEST_DIR, verified=verify.output)
    after >> prepare >> ingest >> verify >> finish
    return finish


def _source_of(entry: DatasetEntry, conns: DagConnections) -> dict[str, Any]:
    """The entry's source and its connection (the DAG's source connection unless the entry names one)."""
    conf = entry.conf(entry.targets[0])
    return {"source": conf.get("source"), "source_conn_id": conf.get("source_conn_id") or conns.source}


def build_refresh_dag(
    entry: DatasetEntry,
    *,
    dag_id: str | None = None,
    connections: DagConnections = DEFAULT,
    spark_pool: str | None = None,
    tags: Sequence[str] = ("imgest", "refresh"),
    default_args: dict[str, Any] | None = None,
) -> DAG:
    """The refresh DAG of ENTRY (a datasets file's entry) under DAG_ID (default ``refresh_<name>``), reaching its
    stores, its source (unless the entry names a connection) and Spark through CONNECTIONS; its Spark job in
    SPARK_POOL (None: $IMGEST_SPARK_POOL, else default_pool); TAGS; DEFAULT_ARGS over imgest's."""
    export_section()  # [imgest] of Airflow's configuration (its spark_pool, ...), as the variables not set
    conns = connections
    spark = {"conn_id": conns.spark, **({"pool": spark_pool} if spark_pool else {})}
    # the work folder follows the run through $IMGEST_STATE_URL (or beside its S3 destination when the deployment
    # spans hosts); the source's connection too
    hooks = work_hooks(
        entry.name,
        _source_of(entry, conns),
        confs=[entry.conf(t) for t in entry.targets],
        aws_conn_id=conns.aws,
        cassandra_conn_id=conns.cassandra,
        spark_conn_id=conns.spark,
    )
    with DAG(
        dag_id=dag_id or f"refresh_{entry.name}",
        description=f"Incremental refresh of {entry.name} ({', '.join(entry.targets)})",
        doc_md=_doc(entry),
        schedule=entry.schedule,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        render_template_as_native_obj=True,
        tags=list(tags),
        default_args=dag_defaults(12, hooks, conns.task_ids(), default_args),
    ) as dag:
        dag.fileloc = caller_file()  # the DAG file that called the factory (caller_file says why)
        lock = DatasetLockOperator(task_id="lock", dataset=entry.name, doc_md="One writer per dataset: waits.")
        release = DatasetLockOperator(task_id="release_lock", dataset=entry.name, release=True, retries=3)

        @task(task_id="scan", doc_md="Scans the source into the dataset's work folder.")
        def scan() -> dict[str, Any]:
            from imgest.flow.steps import scan_step
            from imgest.operators.failures import fail_without_retry
            from imgest.operators.hooks import source_settings

            conf = entry.conf(entry.targets[0])
            with fail_without_retry():
                return scan_step(conf, source_settings(conf.get("source"), conf.get("source_conn_id") or conns.source))

        scanned = scan()
        lock >> scanned
        for target in entry.targets:
            _target_group(entry, target, scanned, conns, spark) >> release
        release.as_teardown(setups=lock)  # runs whatever happened; does not decide the run's state
    return dag
