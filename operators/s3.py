"""Operators for the shard target: make sure the bucket is reachable, verify a published dataset."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from airflow.models import BaseOperator


class EnsureBucketOperator(BaseOperator):
    """Create DEST's bucket if it does not exist; fail with a clear error on refused credentials."""

    template_fields: Sequence[str] = ("dest",)

    def __init__(self, *, dest: str, aws_conn_id: str = "aws_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dest, self.aws_conn_id = dest, aws_conn_id

    def execute(self, context: Any) -> str:
        from imgest.s3_client import ensure_bucket
        from operators.connections import s3_settings

        if not self.dest.startswith("s3://"):
            return self.dest  # a local folder needs no preparation
        bucket = self.dest[5:].split("/", 1)[0]
        ensure_bucket(s3_settings(self.aws_conn_id, bucket), bucket)
        return self.dest


class VerifyShardsOperator(BaseOperator):
    """imgest.verify_shards.verify_shards: every shard listed in manifest.json is there with its sha256."""

    template_fields: Sequence[str] = ("dest",)

    def __init__(self, *, dest: str, aws_conn_id: str = "aws_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dest, self.aws_conn_id = dest, aws_conn_id

    def execute(self, context: Any) -> dict[str, Any]:
        from imgest.shard_store import open_store
        from imgest.verify_shards import ShardVerificationError, verify_shards
        from operators.connections import s3_settings

        settings = (
            s3_settings(self.aws_conn_id, self.dest[5:].split("/", 1)[0]) if self.dest.startswith("s3://") else None
        )
        report = verify_shards(open_store(self.dest, settings))
        self.log.info("verification: %s", json.dumps(report.to_dict()))
        if not report.ok:
            raise ShardVerificationError(f"published shards do not match manifest.json: {report.to_dict()}")
        return report.to_dict()
