"""Operators for the shard and files targets: make sure the bucket is reachable, verify a published dataset."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator


class EnsureBucketOperator(BaseOperator):
    """Create DEST's bucket if it does not exist; fail with a clear error on refused credentials."""

    template_fields: Sequence[str] = ("dest",)

    def __init__(self, *, dest: str, aws_conn_id: str = "aws_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dest, self.aws_conn_id = dest, aws_conn_id

    def execute(self, context: Any) -> str:
        from imgest.flow.steps import prepare_bucket
        from imgest.operators.failures import fail_without_retry
        from imgest.operators.hooks import store_settings

        with fail_without_retry():  # refused keys or a malformed destination: no retries
            return prepare_bucket(self.dest, store_settings(self.dest, self.aws_conn_id))


class VerifyShardsOperator(BaseOperator):
    """Every shard listed in manifest.json is there with its sha256 (imgest.flow.steps.verify_shards)."""

    template_fields: Sequence[str] = ("dest",)

    def __init__(self, *, dest: str, aws_conn_id: str = "aws_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dest, self.aws_conn_id = dest, aws_conn_id

    def execute(self, context: Any) -> dict[str, Any]:
        from imgest.flow.steps import verify_shards
        from imgest.operators.hooks import store_settings

        return verify_shards(self.dest, store_settings(self.dest, self.aws_conn_id))


class VerifyFilesOperator(BaseOperator):
    """Counts, every file's presence and size, and the sha256 of a seeded sample of SAMPLE files per split (empty:
    the default; 0: every file) of a files dataset (imgest.flow.steps.verify_files)."""

    template_fields: Sequence[str] = ("dest", "sample")

    def __init__(self, *, dest: str, sample: str | int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dest, self.sample = dest, sample

    def execute(self, context: Any) -> dict[str, Any]:
        from imgest.core import defaults
        from imgest.flow.steps import verify_files

        sample = defaults.CHECK_SAMPLE if self.sample in (None, "") else int(self.sample)
        return verify_files(self.dest, sample)


class CollectGarbageOperator(BaseOperator):
    """After a publish: delete the stored versions of a shards or files dataset that neither its manifest nor the
    request's ``keep_versions`` earlier ones need (imgest.flow.steps.collect_garbage); returns what it removed. Runs
    while the run holds the dataset's write lock."""

    template_fields: Sequence[str] = ("request", "manifest_dir")

    def __init__(
        self,
        *,
        request: dict[str, Any] | str,
        manifest_dir: str = "",
        aws_conn_id: str = "aws_default",
        cassandra_conn_id: str = "cassandra_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.request, self.manifest_dir, self.aws_conn_id = request, manifest_dir, aws_conn_id
        self.cassandra_conn_id = cassandra_conn_id  # a keyspace's lock store, held while it runs

    def execute(self, context: Any) -> dict[str, Any]:
        from pathlib import Path

        from imgest.flow.request import IngestRequest
        from imgest.flow.steps import collect_garbage
        from imgest.operators.hooks import store_settings
        from imgest.operators.state import run_lease

        conf = dict(self.request)  # type: ignore[arg-type]
        request = IngestRequest.from_conf(conf)
        s3 = store_settings(request.shard_dest, self.aws_conn_id) if request.target == "shards" else None
        # deletes: fenced
        with run_lease(self.dag_id, context["run_id"], request.dataset, context.get("ti")):
            return collect_garbage(conf, s3, Path(self.manifest_dir) if self.manifest_dir else None)
