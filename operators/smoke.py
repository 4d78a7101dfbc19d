"""Operators that round-trip bytes through Cassandra and S3 using Airflow connections."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator


class CassandraRoundTripOperator(BaseOperator):
    """Write a blob to Cassandra and read it back (imgest.sinks.smoke.cassandra_roundtrip)."""

    template_fields: Sequence[str] = ("cassandra_conn_id", "nbytes")

    def __init__(self, *, cassandra_conn_id: str = "cassandra_default", nbytes: int = 1 << 20, **kwargs: Any):
        super().__init__(**kwargs)
        self.cassandra_conn_id = cassandra_conn_id
        self.nbytes = nbytes

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow.providers.apache.cassandra.hooks.cassandra import CassandraHook

        from imgest.sinks.smoke import cassandra_roundtrip

        hook = CassandraHook(cassandra_conn_id=self.cassandra_conn_id)
        try:
            result = cassandra_roundtrip(hook.get_conn(), int(self.nbytes))
        finally:
            hook.shutdown_cluster()
        if not result.equal:
            raise RuntimeError(f"{result.target}: bytes read back differ from bytes written")
        return result.__dict__


class S3RoundTripOperator(BaseOperator):
    """Put an object to S3 and read it back (imgest.sinks.smoke.s3_roundtrip)."""

    template_fields: Sequence[str] = ("aws_conn_id", "bucket", "nbytes")

    def __init__(self, *, bucket: str, aws_conn_id: str = "aws_default", nbytes: int = 1 << 20, **kwargs: Any):
        super().__init__(**kwargs)
        self.bucket = bucket
        self.aws_conn_id = aws_conn_id
        self.nbytes = nbytes

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow.providers.amazon.aws.hooks.s3 import S3Hook

        from imgest.sinks.smoke import s3_roundtrip

        result = s3_roundtrip(S3Hook(aws_conn_id=self.aws_conn_id).get_conn(), self.bucket, int(self.nbytes))
        if not result.equal:
            raise RuntimeError(f"{result.target}: bytes read back differ from bytes written")
        return result.__dict__
