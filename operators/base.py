"""The shared shape of operators driven by the validated ingest request."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator


class RequestOperator(BaseOperator):
    """Stores the request (from the validate task's XCom), the work folder and the connection ids."""

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

    def resolved(self) -> tuple[dict[str, Any], Any, Any]:
        """(request dict, Cassandra settings or None, S3 settings of the shard destination or None), from the
        hooks. Each target reads its own store's connection only: a shards-only or files-only deployment needs no
        Cassandra connection, a Cassandra-only or files-only one no AWS connection (beyond an S3 source's)."""
        from imgest.flow.request import IngestRequest
        from imgest.operators.hooks import ImgestCassandraHook, store_settings

        request = IngestRequest.from_conf(dict(self.request))
        cassandra = ImgestCassandraHook(self.cassandra_conn_id).settings() if request.target == "cassandra" else None
        s3 = store_settings(request.shard_dest, self.aws_conn_id) if request.target == "shards" else None
        return request.as_dict(), cassandra, s3
