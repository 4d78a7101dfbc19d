"""Operator that writes the split file of a finished ingest (imgest.splits)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.models import BaseOperator


class BuildSplitOperator(BaseOperator):
    """Split the train rows of the ingested dataset into parts; writes split.npz (+ split.pckl for Cassandra)."""

    template_fields: Sequence[str] = ("request", "out_dir")

    def __init__(
        self,
        *,
        request: dict[str, Any],
        out_dir: str,
        cassandra_conn_id: str = "cassandra_default",
        aws_conn_id: str = "aws_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.request, self.out_dir = request, out_dir
        self.cassandra_conn_id, self.aws_conn_id = cassandra_conn_id, aws_conn_id

    def execute(self, context: Any) -> dict[str, Any]:
        from imgest.ingest_request import IngestRequest
        from imgest.split_sources import from_cassandra, from_shards
        from imgest.splits import parse_ratios, write_split_files

        request = IngestRequest.from_conf(dict(self.request))
        if request.target == "cassandra":
            from imgest.cassandra_client import cassandra_session
            from operators.connections import cassandra_settings

            tables = request.tables()
            with cassandra_session(cassandra_settings(self.cassandra_conn_id)) as session:
                rows = from_cassandra(
                    session,
                    f"{tables.keyspace}.{tables.metadata_table('train')}",
                    f"{tables.keyspace}.{tables.data_table('train')}",
                    only_split="train",
                )
        else:
            from imgest.shard_store import open_store
            from operators.connections import s3_settings

            dest = request.s3_dest
            settings = s3_settings(self.aws_conn_id, dest[5:].split("/", 1)[0]) if dest.startswith("s3://") else None
            rows = from_shards(open_store(dest, settings), only_split="train")
        balance = request.split_balance
        out = Path(self.out_dir) / f"split-{request.target}.npz"
        split = write_split_files(
            rows,
            parse_ratios(request.split_ratios),
            balance,
            request.split_seed,
            out,
            crs4=request.target == "cassandra",
            settings={"split_of": "train"},
        )
        summary = split.summary()
        self.log.info("split %s: parts %s, unused %s", out, summary["parts"], summary["unused"])
        return {"path": str(out), "parts": summary["parts"], "unused": summary["unused"]}
