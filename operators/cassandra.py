"""Operators for the Cassandra target: apply the CQL schema, verify an ingest."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator


class ApplyCqlSchemaOperator(BaseOperator):
    """Create the keyspace and tables of sql/*.cql for the splits a scan found (idempotent)."""

    template_fields: Sequence[str] = ("request", "manifest_dir")

    def __init__(
        self, *, request: Any, manifest_dir: str, cassandra_conn_id: str = "cassandra_default", **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.request, self.manifest_dir, self.cassandra_conn_id = request, manifest_dir, cassandra_conn_id

    def execute(self, context: Any) -> list[str]:
        from imgest.flow.steps import prepare_cassandra
        from imgest.operators.failures import fail_without_retry
        from imgest.operators.hooks import ImgestCassandraHook

        settings = ImgestCassandraHook(self.cassandra_conn_id).settings()
        with fail_without_retry():  # refused credentials: no retries
            return prepare_cassandra(dict(self.request), Path(self.manifest_dir), settings)


class VerifyCassandraOperator(BaseOperator):
    """Counts and byte-equal samples of the ingested version; marks it complete (imgest.flow.steps)."""

    template_fields: Sequence[str] = ("request", "manifest_dir")

    def __init__(
        self,
        *,
        request: Any,
        manifest_dir: str,
        sample: int = 32,
        cassandra_conn_id: str = "cassandra_default",
        aws_conn_id: str = "aws_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.request, self.manifest_dir, self.sample = request, manifest_dir, sample
        self.cassandra_conn_id = cassandra_conn_id
        self.aws_conn_id = aws_conn_id  # an S3 store of the run's lock ($IMGEST_STATE_URL)

    def execute(self, context: Any) -> dict[str, Any]:
        from imgest.flow.steps import verify_cassandra
        from imgest.operators.hooks import ImgestCassandraHook
        from imgest.operators.state import run_lease

        settings = ImgestCassandraHook(self.cassandra_conn_id).settings()
        request = dict(self.request)
        # completes the version: fenced
        with run_lease(self.dag_id, context["run_id"], request["dataset"], context.get("ti")):
            return verify_cassandra(request, Path(self.manifest_dir), settings, self.sample)
