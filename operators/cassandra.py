"""Operators for the Cassandra target: apply the CQL schema, verify an ingest."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.models import BaseOperator


class ApplyCqlSchemaOperator(BaseOperator):
    """Create the keyspace and tables of sql/*.cql for the splits a scan found (idempotent)."""

    template_fields: Sequence[str] = ("manifest_dir", "keyspace", "table_layout", "table_suffix", "replication")

    def __init__(
        self,
        *,
        manifest_dir: str,
        keyspace: str,
        table_layout: str,
        table_suffix: str,
        replication: str,
        cassandra_conn_id: str = "cassandra_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.manifest_dir, self.keyspace, self.table_layout = manifest_dir, keyspace, table_layout
        self.table_suffix, self.replication, self.cassandra_conn_id = table_suffix, replication, cassandra_conn_id

    def execute(self, context: Any) -> list[str]:
        from imgest.cassandra_client import cassandra_session
        from imgest.cassandra_schema import TableLayout, apply_schema
        from operators.connections import cassandra_settings

        splits = sorted(json.loads((Path(self.manifest_dir) / "scan_report.json").read_text())["per_split"])
        tables = TableLayout(self.keyspace, self.table_layout, self.table_suffix)
        with cassandra_session(cassandra_settings(self.cassandra_conn_id)) as session:
            return apply_schema(session, tables, splits, self.replication)


class VerifyCassandraOperator(BaseOperator):
    """imgest.verify_cassandra.verify: counts and byte-equal samples; marks the version complete."""

    template_fields: Sequence[str] = ("manifest_dir", "keyspace", "table_layout", "table_suffix")

    def __init__(
        self,
        *,
        manifest_dir: str,
        keyspace: str,
        table_layout: str,
        table_suffix: str,
        sample: int = 32,
        cassandra_conn_id: str = "cassandra_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.manifest_dir, self.keyspace, self.table_layout = manifest_dir, keyspace, table_layout
        self.table_suffix, self.sample, self.cassandra_conn_id = table_suffix, sample, cassandra_conn_id

    def execute(self, context: Any) -> dict[str, Any]:
        from imgest.cassandra_client import cassandra_session
        from imgest.cassandra_schema import TableLayout
        from imgest.verify_cassandra import VerificationError, verify
        from operators.connections import cassandra_settings

        manifest_dir = Path(self.manifest_dir)
        version = json.loads((manifest_dir / "ingest_cassandra.json").read_text())["version"]
        tables = TableLayout(self.keyspace, self.table_layout, self.table_suffix)
        with cassandra_session(cassandra_settings(self.cassandra_conn_id)) as session:
            report = verify(session, manifest_dir, tables, None, version, self.sample)
        self.log.info("verification: %s", json.dumps(report.to_dict()))
        if not report.ok:
            raise VerificationError(f"Cassandra data does not match the manifest: {report.to_dict()}")
        return report.to_dict()
