"""The Airflow connection ids one of imgest's DAGs reads: what a DAG factory takes (imgest.operators.ingest_dag,
imgest.operators.refresh_dag, imgest.operators.check_dag), so that a platform keeps its own connection names.

Every published version's Asset event carries the ids its DAG used (``connections`` in the event's extra), so that
``check_datasets`` reads the version back through the same connections.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

START_DATE = datetime(2026, 1, 1)  # every imgest DAG's (none catches up)


@dataclass(frozen=True)
class DagConnections:
    """CASSANDRA: the cluster of the Cassandra target (and of a keyspace's lock store); AWS: the S3 destination of
    the shards target and the run's state store ($IMGEST_STATE_URL, or beside the destination); SOURCE: the
    connection an ``s3://`` source is read through when the run's conf names none; SPARK: the Spark master the jobs
    are submitted to."""

    cassandra: str = "cassandra_default"
    aws: str = "aws_default"
    source: str = "aws_default"
    spark: str = "spark_default"

    def task_ids(self) -> dict[str, str]:
        """The default arguments that hand them to every operator whose signature takes them (Airflow applies a
        default argument only there): the stores' ids and the Spark jobs' state store."""
        return {"aws_conn_id": self.aws, "cassandra_conn_id": self.cassandra, "state_conn_id": self.aws}

    def to_extra(self) -> dict[str, str]:
        """What an Asset event's extra records of them."""
        return asdict(self)

    @classmethod
    def from_extra(cls, extra: dict[str, Any]) -> DagConnections:
        """The ids an Asset event's EXTRA recorded (the defaults for an event from before they were recorded)."""
        given = extra.get("connections") or {}
        return cls(**{k: str(v) for k, v in given.items() if k in cls.__dataclass_fields__ and v})


DEFAULT = DagConnections()


def dag_defaults(hours: float, *layers: dict[str, Any] | None) -> dict[str, Any]:
    """An imgest DAG's default arguments: two retries 30 s apart, a timeout of HOURS, then each of LAYERS over them
    (the work-folder hooks, the connection ids, the caller's own default_args)."""
    merged: dict[str, Any] = {
        "retries": 2,
        "retry_delay": timedelta(seconds=30),
        "execution_timeout": timedelta(hours=hours),
    }
    for layer in layers:
        merged |= layer or {}
    return merged


def caller_file(depth: int = 2) -> str:
    """The file of the code DEPTH frames up (a factory's caller: the DAG file). A DAG's ``fileloc`` must name the
    file that defines it, not the factory's module: the Airflow worker parses that file to run the DAG's tasks, and
    the UI shows it as the DAG's code."""
    return sys._getframe(depth).f_code.co_filename
