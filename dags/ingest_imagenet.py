"""ingest_imagenet: scan a dataset, then Spark-ingest it into Cassandra tables or webdataset shards on S3.

Trigger from the UI's form or: airflow dags trigger ingest_imagenet --conf '{"sample": true, "target": "shards"}'
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Asset, AssetAlias, Param, task
from imgest.operators.cassandra import ApplyCqlSchemaOperator, VerifyCassandraOperator
from imgest.operators.readback import ReadThroughputOperator
from imgest.operators.s3 import EnsureBucketOperator, VerifyFilesOperator, VerifyShardsOperator
from imgest.operators.spark import CassandraIngestSubmitOperator, PackShardsSubmitOperator, WriteFilesSubmitOperator
from imgest.operators.splits import BuildSplitOperator
from imgest.operators.validate import ValidateXnvmeOperator

from imgest.flow.request import param_specs

DATASETS = AssetAlias("imgest-datasets")
REQUEST = "{{ ti.xcom_pull(task_ids='validate') }}"
MANIFEST_DIR = "{{ ti.xcom_pull(task_ids='scan')['manifest_dir'] }}"
CASSANDRA_ARGS = "{{ ti.xcom_pull(task_ids='scan')['cassandra_args'] }}"
SHARDS_ARGS = "{{ ti.xcom_pull(task_ids='scan')['shards_args'] }}"
FILES_ARGS = "{{ ti.xcom_pull(task_ids='scan')['files_args'] }}"
SHARD_DEST = "{{ ti.xcom_pull(task_ids='validate')['s3_dest'] or 's3://imgest/' ~ params.dataset }}"
FILES_DEST = "{{ ti.xcom_pull(task_ids='scan')['files_dest'] }}"

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
- **files**: `<split>/<wnid>/<id>.jpg` (the tree DALI `fn.readers.file` reads) with `samples.parquet` and
  `manifest.json`, under *Files destination* (default `$IMGEST_HOME/files/<dataset>`).

After the split file, `read_throughput` reads the stored train rows back through DALI with every reader of the
target (raw bytes and a CPU training pipeline), hashing every sample against its ingest sha256; for the files
target `validate_xnvme` then reads them with DALI's file reader, the Python file API and xNVMe's file and block
APIs. Reports and plots land in the work folder and are referenced from the version record.

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
        from imgest.flow.steps import scan_step

        return scan_step(request)

    @task.branch
    def choose_target(request: dict[str, Any]) -> str:
        return {"cassandra": "prepare_cassandra", "shards": "prepare_bucket", "files": "ingest_files"}[
            request["target"]
        ]

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
    ingest_files = WriteFilesSubmitOperator(
        task_id="ingest_files", application_args=FILES_ARGS, doc_md="Spark job: write <split>/<wnid>/<id>.jpg files."
    )
    verify_files = VerifyFilesOperator(
        task_id="verify_files", dest=FILES_DEST, doc_md="Every file hashes to its recorded sha256; counts match."
    )
    build_split = BuildSplitOperator(
        task_id="build_split",
        request=REQUEST,
        out_dir=MANIFEST_DIR,
        trigger_rule="none_failed_min_one_success",
        doc_md="Writes split-<target>.npz (ratios, balance, seed) from the ingested train rows.",
    )

    read_throughput = ReadThroughputOperator(
        task_id="read_throughput",
        request=REQUEST,
        out_dir=MANIFEST_DIR,
        doc_md="DALI read-back of the stored train rows, every reader of the target; every byte and label checked.",
    )

    @task.short_circuit(doc_md="The xNVMe check applies to the files target.")
    def xnvme_applies(request: dict[str, Any]) -> bool:
        return request["target"] == "files"

    validate_xnvme = ValidateXnvmeOperator(
        task_id="validate_xnvme",
        dataset_dir=FILES_DEST,
        out_dir=MANIFEST_DIR,
        loop_fs="{{ ti.xcom_pull(task_ids='validate')['xnvme_loop_fs'] or '' }}",
        doc_md="DALI file reader vs Python file API vs xNVMe file and block APIs, byte-exact.",
    )

    @task(outlets=[DATASETS], doc_md="Announces the verified dataset as an Asset (tables, shard prefix or folder).")
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
    branch >> ingest_files >> verify_files
    published = publish_asset(request)
    [verify_cassandra, verify_shards, verify_files] >> build_split >> read_throughput >> published
    read_throughput >> xnvme_applies(request) >> validate_xnvme
