"""Operator for the DAG's read_throughput task (imgest.flow.steps.read_throughput)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.models import BaseOperator


class ReadThroughputOperator(BaseOperator):
    """Read the stored version back with DALI (every reader of its target); fail on any byte or label mismatch."""

    template_fields: Sequence[str] = ("request", "out_dir")

    def __init__(
        self,
        *,
        request: Any,
        out_dir: str,
        cassandra_conn_id: str = "cassandra_default",
        aws_conn_id: str = "aws_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.request, self.out_dir = request, out_dir
        self.cassandra_conn_id, self.aws_conn_id = cassandra_conn_id, aws_conn_id

    def execute(self, context: Any) -> dict[str, Any]:
        from imgest.operators.hooks import ImgestCassandraHook, store_settings

        from imgest.flow.request import IngestRequest
        from imgest.flow.steps import read_throughput

        request = IngestRequest.from_conf(dict(self.request))
        cassandra = ImgestCassandraHook(self.cassandra_conn_id).settings()
        s3 = store_settings(request.shard_dest, self.aws_conn_id)
        return read_throughput(request.as_dict(), Path(self.out_dir), cassandra, s3)
