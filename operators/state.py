"""An Airflow task's view of its run's state: where the run keeps it, and the run's hold of its dataset's lock.

Each task of an imgest DAG decides where the run's state lives before it runs (``use_run_state``, called by the
work hooks' ``pull_work``): Airflow's executor (read here, inside the task, never when a DAG file is parsed) and
the master of ``spark_default`` tell whether the run spans hosts (``imgest.core.run_state``). A state URL derived
from the run's S3 destination is exported as ``$IMGEST_STATE_URL`` to this task's process, where the lock store,
the work area and the Spark driver the task submits (which inherits the environment) all read it; every task of
the run derives the same one. The tasks that publish hold the run's lease while they work (``run_lease``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from imgest.core.run_state import Deployment

log = logging.getLogger(__name__)


def spark_master(conn_id: str = "spark_default") -> str:
    """The master named by the Spark connection CONN_ID (its host, with port when given); yarn when there is no
    such connection, as the Spark provider then submits there."""
    from imgest.operators.compat import connection_or_none

    conn = connection_or_none(conn_id)
    if conn is None:
        return "yarn"
    if conn.conn_type == "spark_connect":  # the provider's Spark Connect connection: sc://host:port (its token apart)
        return connect_master(conn)
    host = conn.host or "local[*]"
    return f"{host}:{conn.port}" if conn.port else host


def connect_master(conn: Any) -> str:
    """The ``sc://host:port`` endpoint of a Spark Connect connection (port 15002 when it names none), with its
    ``user_id`` (login) and ``use_ssl`` (extra) but never its token (the password: the job gets it as
    SPARK_CONNECT_AUTHENTICATE_TOKEN, kept off command lines and logs)."""
    host = str(conn.host or "")
    host = host if "://" in host else f"sc://{host}"
    url = f"{host.rstrip('/')}:{conn.port or 15002}" if host.count(":") < 2 else host.rstrip("/")
    params = [f"user_id={conn.login}"] if conn.login else []
    use_ssl = (conn.extra_dejson or {}).get("use_ssl")
    if use_ssl is not None:
        params.append(f"use_ssl={str(use_ssl).lower()}")
    return f"{url}/;{';'.join(params)}" if params else url


def task_deployment(spark_conn_id: str = "spark_default") -> Deployment:
    """This task's deployment: Airflow's configured executor and the Spark master of SPARK_CONN_ID."""
    from airflow.configuration import conf

    return Deployment(conf.get("core", "executor"), spark_master(spark_conn_id))


def use_run_state(
    confs: Sequence[dict[str, Any]], cassandra_conn_id: str = "cassandra_default", spark_conn_id: str = "spark_default"
) -> str | None:
    """Decide where the run of CONFS (its request, or each target's conf) keeps its state and export a derived URL
    as $IMGEST_STATE_URL for this task; returns the URL (None: the local state folder). ConfigError naming
    IMGEST_STATE_URL when the run spans hosts and no store every host reaches is known. The lock's stores (the
    keyspace a Cassandra target writes, on the cluster of CASSANDRA_CONN_ID; beside an S3 destination) go to
    $IMGEST_LOCK_URL, as the CLI's. Whether the run spans hosts follows from the master of SPARK_CONN_ID."""
    from imgest.core.lock_stores import LOCK_URL_ENV, STATE_URL_ENV, lock_url_for, state_setting
    from imgest.core.run_state import state_url_for
    from imgest.flow.steps import s3_destination

    dests = [d for d in (s3_destination(c) for c in confs if c) if d]
    configured = state_setting()
    url = state_url_for(task_deployment(spark_conn_id), dests[0] if dests else None, configured)
    lock = lock_url_for(dests[0] if dests else None, _tables_lock(confs, cassandra_conn_id))
    if lock:
        os.environ[LOCK_URL_ENV] = lock
    else:
        os.environ.pop(LOCK_URL_ENV, None)
    if url and not configured:
        log.info("the run spans hosts: its state lives at %s (derived from its S3 destination)", url)
        os.environ[STATE_URL_ENV] = url
    return url


def aws_conn_of(task: Any, default: str = "aws_default") -> str:
    """The AWS connection id of TASK (an operator, or a task instance: its task's), else DEFAULT (the DAG's)."""
    task = getattr(task, "task", task)
    return str(getattr(task, "aws_conn_id", None) or default)


def cassandra_conn_of(task: Any, default: str = "cassandra_default") -> str:
    """The Cassandra connection id of TASK (an operator, or a task instance: its task's), else DEFAULT (the DAG's)."""
    task = getattr(task, "task", task)
    return str(getattr(task, "cassandra_conn_id", None) or default)


def _tables_lock(confs: Sequence[dict[str, Any]], cassandra_conn_id: str) -> str | None:
    """The lock store in the keyspace the Cassandra target of CONFS writes, or None when none writes Cassandra."""
    from imgest.flow.request import IngestRequest

    tables = [r for r in (IngestRequest.from_conf(c) for c in confs if c) if r.target == "cassandra"]
    if not tables:
        return None
    from imgest.core.lock_stores import cassandra_lock_url
    from imgest.operators.hooks import ImgestCassandraHook

    settings = ImgestCassandraHook(cassandra_conn_id).settings()
    return cassandra_lock_url(settings, tables[0].keyspace, tables[0].replication)


@contextmanager
def run_lease(
    dag_id: str,
    run_id: str,
    dataset: str,
    ti: Any = None,
    aws_conn_id: str | None = None,
    cassandra_conn_id: str | None = None,
) -> Iterator[None]:
    """This run's hold of DATASET's lock while the block runs: its lease renewed, the block's publishing fenced
    against it (imgest.core.locks), and a lost lock (LockLostError) failing the task without retries. With TI (the
    task instance), this attempt claims the lock for its task first: an older attempt still running somewhere (a
    zombie whose worker Airflow gave up on) publishes nothing from then on. The lock's stores are reached through
    AWS_CONN_ID and CASSANDRA_CONN_ID, else the task's connections."""
    from imgest.core import locks
    from imgest.operators.compat import fail_exception
    from imgest.operators.hooks import lock_store

    holder = locks.airflow_holder(dag_id, run_id)
    attempt = locks.Attempt(str(ti.task_id), int(ti.try_number)) if ti is not None else None
    try:
        store = lock_store(
            aws_conn_id=aws_conn_id or aws_conn_of(ti), cassandra_conn_id=cassandra_conn_id or cassandra_conn_of(ti)
        )
        with locks.keep_alive(dataset, holder, store, attempt):
            yield
    except locks.LockLostError as exc:  # retrying cannot give the lock back
        raise fail_exception()(str(exc)) from None
