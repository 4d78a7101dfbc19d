"""A deferrable Spark job on the Spark Connect route: what the operator hands its client and takes from its trigger.

With ``deferrable`` (the operator's argument, else ``$IMGEST_SPARK_DEFERRABLE`` / ``[imgest] spark_deferrable``) a job
run through Spark Connect keeps each partition's results in the run's results folder and, at each of its Spark
calls, leaves the operation running on the server and exits (imgest.spark.detach); the task then defers to
operators.connect_trigger (no process of it on the worker while Spark runs, its slot free) and, once the operation
ended, runs the client again, which takes the results and goes on. On the spark-submit routes the driver is this
worker's child for the whole job: there a job does not defer (the standalone master runs no Python driver in cluster
mode), and the operator says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

DEFERRABLE_ENV = "IMGEST_SPARK_DEFERRABLE"
MAX_DEFERRALS = 20  # imgest's jobs make 1-3 Spark calls each; a server that forgets operations costs one more each;
# after that many the client runs attached (``detaches``)


def spark_deferrable_default() -> bool:
    """Whether Spark Connect jobs defer: ``$IMGEST_SPARK_DEFERRABLE`` (``[imgest] spark_deferrable``), off unless
    1/true/yes/on (a deployment without a triggerer must not defer)."""
    return os.environ.get(DEFERRABLE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def run_key(context: Any) -> str:
    """This task attempt's key (its DAG, run, task, map index and try): the name of its results folder."""
    ti = context["ti"]
    parts = (ti.dag_id, context["run_id"], ti.task_id, getattr(ti, "map_index", -1), ti.try_number)
    return hashlib.sha256("\0".join(str(p) for p in parts).encode()).hexdigest()[:20]


@contextmanager
def defer_env(context: Any, resumed: dict[str, Any] | None) -> Iterator[dict[str, str]]:
    """The client's variables for a deferrable run (RESUMED: the trigger's last event, {} on the first run; None: not
    deferrable, no variables), with the detach file in a folder removed after the block (none once the run
    deferred MAX_DEFERRALS times: ``detaches``)."""
    from imgest.spark.detach import DETACH_ENV, DONE_ENV, RUN_ENV

    if resumed is None:
        yield {}
        return
    with tempfile.TemporaryDirectory(prefix="imgest-connect-") as tmp:
        extra = {RUN_ENV: run_key(context)}
        if detaches(resumed):
            extra[DETACH_ENV] = str(Path(tmp) / "detached.json")
        if resumed:
            extra[DONE_ENV] = json.dumps(resumed)
        yield extra


def detached_record(job: str, extra: dict[str, str]) -> dict[str, Any]:
    """What the client left running (its detach file); an error saying so where it exited as if detached without one."""
    from airflow.sdk.exceptions import AirflowException

    from imgest.spark.detach import DETACH_ENV, DETACHED_EXIT

    path = Path(extra.get(DETACH_ENV, ""))
    if not extra.get(DETACH_ENV) or not path.is_file():
        raise AirflowException(
            f"{job} exited with {DETACHED_EXIT} (an operation left running on Spark) but recorded no operation at "
            f"{path}: nothing to follow; see the task log"
        )
    return dict(json.loads(path.read_text()))


def lock_of(dataset: str, context: Any, state_conn_id: str) -> dict[str, Any]:
    """What the trigger needs to renew this run's lease on DATASET's lock as this task attempt held it ({} without
    one): the stores, the attempt, the lock's epoch in each store now, the lease."""
    if not dataset:
        return {}
    from imgest.core import locks
    from imgest.operators.hooks import lock_store
    from imgest.operators.state import cassandra_conn_of

    ti = context["ti"]
    cassandra_conn_id = cassandra_conn_of(ti)
    stores = lock_store(aws_conn_id=state_conn_id, cassandra_conn_id=cassandra_conn_id)
    holder = locks.airflow_holder(str(ti.dag_id), str(context["run_id"]))
    return {
        "dataset": dataset,
        "dag_id": str(ti.dag_id),
        "run_id": str(context["run_id"]),
        "task_id": str(ti.task_id),
        "try_number": int(ti.try_number),
        "epochs": [locks.learn_epoch(dataset, holder, store) for store in stores.stores],
        "lease_s": holder.lease_s,
        "location": stores.location,
        "aws_conn_id": state_conn_id,
        "cassandra_conn_id": cassandra_conn_id,
    }


def forget(context: Any, state_env: dict[str, str]) -> None:
    """Remove this task attempt's results folder where no client of it will run again (STATE_ENV: the keys of the
    run's state store, as its client had them); a failure to is logged (the folder is only space)."""
    import logging

    from imgest.spark.detach import forget_run

    before = dict(os.environ)
    os.environ.update(state_env)
    try:
        forget_run(run_key(context))
    except Exception as exc:
        logging.getLogger(__name__).warning("could not remove the results folder of this attempt: %s", exc)
    finally:
        os.environ.clear()
        os.environ.update(before)


def check_event(job: str, event: dict[str, Any]) -> None:
    """Fail on the trigger's EVENT where the job cannot go on: its own error on Spark, or a lost lock."""
    from airflow.sdk.exceptions import AirflowException

    from imgest.operators.compat import fail_exception
    from imgest.operators.connect_trigger import FAILED, LOST

    status = event.get("status")
    if status == FAILED:
        operation = event.get("operation_id")
        raise AirflowException(f"{job}: its operation {operation} failed on Spark: {event.get('error')}")
    if status == LOST:
        raise fail_exception()(str(event.get("error")))


def detaches(resumed: dict[str, Any]) -> bool:
    """Whether the client may leave its next operation running (RESUMED: the trigger's last event): not after
    MAX_DEFERRALS (a client that never finds what its executors kept would start its partitions forever; attached,
    it runs what is missing and fails naming the folder if the results are still not there)."""
    return int(resumed.get("deferrals", 0)) < MAX_DEFERRALS
