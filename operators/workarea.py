"""Task hooks that carry a dataset's work folder between tasks through object storage (``$IMGEST_STATE_URL``).

Every task of the imgest DAGs runs ``pull_work`` before it executes and ``push_work`` after it succeeds
(``work_hooks``, in each DAG's ``default_args``), so a task may run on another worker or pod than the one
before it: it finds the manifest, plans, reports, split files and refresh state the earlier tasks wrote. Without
``$IMGEST_STATE_URL`` both do nothing (one machine, or a work folder every worker mounts). The store is reached
through the DAG's AWS connection (``aws_default`` unless its factory names another). ``pull_work`` first decides
where the run's state lives (``imgest.operators.state.use_run_state``): on a deployment across hosts without
``$IMGEST_STATE_URL``, next to the run's S3 destination, or the task fails without retries naming the variable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger(__name__)


def _request(context: Any) -> dict[str, Any]:
    """The run's request as `validate` resolved it ({} in validate itself)."""
    request = context["ti"].xcom_pull(task_ids="validate") if context["ti"].task_id != "validate" else None
    return request if isinstance(request, dict) else {}


def _dataset(context: Any, fixed: str | None) -> str:
    return fixed or str(_request(context).get("dataset", ""))


def _scanned(context: Any) -> dict[str, Any]:
    """What the run's scan task returned ({} before it ran, and in a DAG without one)."""
    if context["ti"].task_id in ("validate", "lock", "scan"):
        return {}
    scan = context["ti"].xcom_pull(task_ids="scan")
    return scan if isinstance(scan, dict) else {}


def _ensure_sample(context: Any) -> None:
    """A run of the generated sample reads it on whichever host a task runs: generate it here too (the same spec
    gives the same bytes on every host, so the job, the verify and the read-back see what the scan saw), unless
    the scan put it in the state store (hosts that share no disk), where every host reads it."""
    request = _request(context)
    if request.get("sample") and request.get("dataset") and not _scanned(context).get("source_root"):
        from imgest.core.paths import state_dir
        from imgest.sources.devdata.sample import DEMO_SAMPLE, ensure_sample

        ensure_sample(state_dir() / "demo" / str(request["dataset"]), DEMO_SAMPLE)


def _use_run_state(
    confs: Sequence[dict[str, Any]],
    context: Any,
    cassandra_conn_id: str = "cassandra_default",
    spark_conn_id: str = "spark_default",
) -> None:
    """Where this run keeps its state (exported for the task when derived); no retries when it has nowhere. The
    keyspace's lock store is reached through the task's Cassandra connection."""
    from imgest.operators.failures import fail_without_retry
    from imgest.operators.state import cassandra_conn_of, use_run_state

    with fail_without_retry():
        use_run_state(confs, cassandra_conn_of(context.get("task"), cassandra_conn_id), spark_conn_id)


def _area(context: Any, dataset: str, aws_conn_id: str = "aws_default") -> Any:
    from imgest.core.lock_stores import state_url
    from imgest.core.workarea import work_area

    url = state_url()
    if url is None or not dataset:
        return None
    from imgest.operators.hooks import store_settings

    return work_area(dataset, store_settings(url, aws_conn_id))


def work_hooks(
    dataset: str | None = None,
    source: dict[str, Any] | None = None,
    *,
    confs: Sequence[dict[str, Any]] | None = None,
    aws_conn_id: str = "aws_default",
    cassandra_conn_id: str = "cassandra_default",
    spark_conn_id: str = "spark_default",
) -> dict[str, Callable[..., None]]:
    """``pre_execute`` / ``post_execute`` for a DAG's default_args; DATASET for a DAG of one dataset, else the
    dataset the run's ``validate`` task resolved. Each task also reads an ``s3://`` source through the run's
    source connection: SOURCE's ``source`` / ``source_conn_id`` (a DAG of one dataset), else the request's. The
    run's state lives next to the S3 destination of CONFS (a DAG of one dataset: its targets' confs), else the
    request's, when the deployment spans hosts and ``$IMGEST_STATE_URL`` is unset. The state store is reached
    through AWS_CONN_ID; a keyspace's lock store through the task's Cassandra connection, else CASSANDRA_CONN_ID."""
    from imgest.core.workarea import ephemeral

    def pull_work(context: Any) -> None:
        from imgest.operators.config_options import export_section
        from imgest.operators.connections import register_request_source, register_run_source

        export_section()  # [imgest] of Airflow's configuration, as the IMGEST_* variables this task lacks
        register_request_source(source if source is not None else _request(context))
        scanned = _scanned(context)  # where the scan found the source (the sample's copy in the store, too)
        register_run_source(scanned.get("source_root"), scanned.get("source_conn_id"))
        name = _dataset(context, dataset)
        if name:  # (validate decides it with the request it validates)
            conns = (cassandra_conn_id, spark_conn_id)
            _use_run_state(confs if confs is not None else [_request(context)], context, *conns)
        if name and ephemeral():  # this task starts on an empty disk, as a fresh pod does
            import shutil

            from imgest.core.workdir import dataset_workdir

            shutil.rmtree(dataset_workdir(name), ignore_errors=True)
        area = _area(context, name, aws_conn_id)
        if area is not None:
            from imgest.operators.task_reads import task_reads

            reads = task_reads(str(getattr(context["ti"], "dag_id", "")), context["ti"].task_id)
            log.info("work area %s: pulled %d files into %s", area.prefix, area.pull(reads), area.local)
        if dataset is None:  # ingest_imagenet's run: its source may be the generated sample
            _ensure_sample(context)

    def push_work(context: Any, result: Any = None) -> None:
        area = _area(context, _dataset(context, dataset), aws_conn_id)
        if area is None:
            return
        sent, deleted = area.push()
        log.info("work area %s: pushed %d files, deleted %d", area.prefix, sent, deleted)
        if ephemeral():  # the store holds it all: nothing of the run stays on this disk
            import shutil

            shutil.rmtree(area.local, ignore_errors=True)

    return {"pre_execute": pull_work, "post_execute": push_work}
