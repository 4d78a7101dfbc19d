"""ingest_imagenet: scan a dataset, then Spark-ingest it into Cassandra tables or webdataset shards on S3.

Trigger from the UI's form or: airflow dags trigger ingest_imagenet --conf '{"sample": true, "target": "shards"}'
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Asset, AssetAlias, Param, task
from imgest.operators.cassandra import ApplyCqlSchemaOperator, VerifyCassandraOperator
from imgest.operators.s3 import EnsureBucketOperator, VerifyShardsOperator
from imgest.operators.spark import CassandraIngestSubmitOperator, PackShardsSubmitOperator
from imgest.operators.splits import BuildSplitOperator

from imgest.flow.request import param_specs

DATASETS = AssetAlias("imgest-datasets")
REQUEST = "{{ ti.xcom_pull(task_ids='validate') }}"
MANIFEST_DIR = "{{ ti.xcom_pull(task_ids='scan')['manifest_dir'] }}"
CASSANDRA_ARGS = "{{ ti.xcom_pull(task_ids='scan')['cassandra_args'] }}"
SHARDS_ARGS = "{{ ti.xcom_pull(task_ids='scan')['shards_args'] }}"
SHARD_DEST = "{{ ti.xcom_pull(task_ids='validate')['s3_dest'] or 's3://imgest/' ~ params.dataset }}"

DOC = """
### Ingest an ImageNet-style dataset

Fill **Source dataset** (a folder or `ILSVRC2012_img_train.tar` the worker can read) or tick **Use the generated
sample**, pick a **Target**, press *Trigger*.

- **cassandra**: `data` (`id uuid, label int, data blob`, the cassandra-dali-plugin layout) and `metadata`
  tables plus a `dataset_versions` row, in the keyspace on `cassandra_default`. Read back with the
  cassandra-dali-plugin or imgest's Cassandra reader, ids from `split-cassandra.npz`.
- **shards**: `{split}-{index:06d}.tar` webdataset shards with DALI `.idx` files, `manifest.json` last, at the
  *Shard destination* on `aws_default` (or a folder). Read back with `fn.readers.webdataset` or
  `webdataset.WebDataset`.

Every run writes its work folder (manifest, quarantine list, job summary, `split-<target>.npz`) under
`$IMGEST_HOME/work/<dataset>/`. Bad settings fail `validate` before any Spark work, every problem on its first
log line.
"""

with DAG(
    dag_id="ingest_imagenet",
    description="ImageNet-style dataset -> Cassandra tables or webdataset shards, verified",
    doc_md=DOC,
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    render_template_as_native_obj=True,
    tags=["imgest", "ingest"],
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30), "execution_timeout": timedelta(hours=12)},
    params={name: Param(**spec) for name, spec in param_specs().items()},
) as dag:

    @task(doc_md="Checks every setting together; fails at once (no retries) listing each problem.")
    def validate(params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Reject bad conf with every problem listed, before any Spark work (AirflowFailException: no retries)."""
        from airflow.exceptions import AirflowFailException

        from imgest.core.errors import ConfigError
        from imgest.flow.steps import validate_conf

        try:
            return validate_conf(dict(params or {}))
        except ConfigError as exc:
            raise AirflowFailException(str(exc)) from None

    @task(doc_md="Lists images, labels and ids into `manifest.parquet` in the dataset's work folder.")
    def scan(request: dict[str, Any]) -> dict[str, Any]:
        """Scan the source; nothing ingestible fails at once (no retries), naming the quarantine list."""
        from imgest.operators.failures import fail_without_retry

        from imgest.flow.steps import scan_step

        with fail_without_retry():
            return scan_step(request)

    @task.branch
    def choose_target(request: dict[str, Any]) -> str:
        return f"prepare_{'cassandra' if request['target'] == 'cassandra' else 'bucket'}"

    prepare_cassandra = ApplyCqlSchemaOperator(
        task_id="prepare_cassandra", request=REQUEST, manifest_dir=MANIFEST_DIR, doc_md="Keyspace and tables."
    )
    ingest_cassandra = CassandraIngestSubmitOperator(
        task_id="ingest_cassandra", application_args=CASSANDRA_ARGS, doc_md="Spark job: transform and write rows."
    )
    verify_cassandra = VerifyCassandraOperator(
        task_id="verify_cassandra",
        request=REQUEST,
        manifest_dir=MANIFEST_DIR,
        doc_md="Counts per split and label, byte-equal samples; marks the version complete.",
    )
    prepare_bucket = EnsureBucketOperator(task_id="prepare_bucket", dest=SHARD_DEST, doc_md="Bucket exists, keys ok.")
    ingest_shards = PackShardsSubmitOperator(
        task_id="ingest_shards", application_args=SHARDS_ARGS, doc_md="Spark job: pack, stage, publish shards."
    )
    verify_shards = VerifyShardsOperator(
        task_id="verify_shards", dest=SHARD_DEST, doc_md="Every shard of manifest.json present with its sha256."
    )
    build_split = BuildSplitOperator(
        task_id="build_split",
        request=REQUEST,
        out_dir=MANIFEST_DIR,
        trigger_rule="none_failed_min_one_success",
        doc_md="Writes split-<target>.npz (ratios, balance, seed) from the ingested train rows.",
    )

    @task(outlets=[DATASETS], doc_md="Announces the verified dataset as an Asset (tables or shard prefix).")
    def publish_asset(request: dict[str, Any], *, outlet_events: Any = None) -> str:
        """Announce the verified dataset as an Asset (keyspace/table or S3 prefix)."""
        from imgest.operators.hooks import ImgestCassandraHook

        from imgest.flow.steps import asset_uri

        settings = ImgestCassandraHook().settings()
        uri = asset_uri(request, f"{settings.hosts[0]}:{settings.port}")
        outlet_events[DATASETS].add(Asset(uri), extra={"dataset": request["dataset"], "target": request["target"]})
        return uri

    request = validate()
    scanned = scan(request)
    branch = choose_target(request)
    scanned >> branch
    branch >> prepare_cassandra >> ingest_cassandra >> verify_cassandra
    branch >> prepare_bucket >> ingest_shards >> verify_shards
    [verify_cassandra, verify_shards] >> build_split >> publish_asset(request)
