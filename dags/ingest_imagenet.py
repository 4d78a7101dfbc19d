"""ingest_imagenet: scan a dataset, then Spark-ingest it into Cassandra tables or webdataset shards on S3.

Trigger from the UI's form or: airflow dags trigger ingest_imagenet --conf '{"target": "shards"}'
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Asset, AssetAlias, Param, task

from operators.cassandra import ApplyCqlSchemaOperator, VerifyCassandraOperator
from operators.s3 import EnsureBucketOperator, VerifyShardsOperator
from operators.spark import ImgestSparkSubmitOperator
from operators.splits import BuildSplitOperator

DATASETS = AssetAlias("imgest-datasets")
MANIFEST_DIR = "{{ ti.xcom_pull(task_ids='scan')['manifest_dir'] }}"
CASSANDRA_ARGS = "{{ ti.xcom_pull(task_ids='scan')['cassandra_args'] }}"
SHARDS_ARGS = "{{ ti.xcom_pull(task_ids='scan')['shards_args'] }}"

with DAG(
    dag_id="ingest_imagenet",
    description="ImageNet-style dataset -> Cassandra tables or webdataset shards, verified",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    render_template_as_native_obj=True,
    tags=["imgest", "ingest"],
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30), "execution_timeout": timedelta(hours=12)},
    params={
        "source": Param(
            "",
            type="string",
            title="Source dataset",
            description="Folder or ILSVRC2012_img_train.tar; empty = the generated embedded sample",
        ),
        "layout": Param("auto", enum=["auto", "cls-loc", "imagefolder", "flat", "tar"], title="Layout"),
        "dataset": Param(
            "imagenet-sample",
            type="string",
            pattern="^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
            title="Dataset name",
            description="Used in ids, work folder and version records",
        ),
        "target": Param("cassandra", enum=["cassandra", "shards"], title="Target"),
        "image_mode": Param(
            "jpeg",
            enum=["jpeg", "unchanged"],
            title="Image mode",
            description="jpeg: resize + center-crop + re-encode; unchanged: original bytes",
        ),
        "resize": Param(256, type="integer", minimum=8, maximum=4096, title="Resize shorter side to"),
        "crop": Param(224, type="integer", minimum=8, maximum=4096, title="Center-crop size"),
        "quality": Param(90, type="integer", minimum=1, maximum=100, title="JPEG quality"),
        "keyspace": Param("imgest", type="string", pattern="^[A-Za-z][A-Za-z0-9_]{0,47}$", title="Keyspace"),
        "table_layout": Param(
            "split-column",
            enum=["split-column", "per-split"],
            title="Table layout",
            description="one data/metadata pair with a split column, or data_<split> tables",
        ),
        "table_suffix": Param(
            "",
            type="string",
            pattern="^[A-Za-z0-9_]{0,20}$",
            title="Table suffix",
            description="e.g. _orig for UNCHANGED images",
        ),
        "replication": Param(
            "SimpleStrategy:1",
            type="string",
            title="Keyspace replication",
            description="SimpleStrategy:N or NetworkTopologyStrategy:dc1=N,dc2=M",
        ),
        "s3_dest": Param(
            "s3://imgest/imagenet-sample",
            type="string",
            title="Shard destination",
            description="s3://bucket/prefix (connection aws_default) or an absolute folder",
        ),
        "shard_max_count": Param(5000, type="integer", minimum=1, title="Samples per shard, at most"),
        "shard_max_bytes": Param(1 << 30, type="integer", minimum=65536, title="Bytes per shard, at most"),
        "shuffle_seed": Param(0, type="integer", title="Shuffle seed"),
        "split_ratios": Param("8,2", type="string", title="Split ratios", description="e.g. 8,2 or 7,2,1"),
        "split_balance": Param(
            "original",
            type="string",
            title="Class balance",
            description="original, random, or one weight per class (comma separated)",
        ),
        "split_seed": Param(0, type="integer", title="Split seed"),
        "spark_partitions": Param(0, type="integer", minimum=0, title="Spark partitions", description="0 = automatic"),
    },
) as dag:

    @task
    def validate(params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Reject bad conf with every problem listed, before any Spark work (AirflowFailException: no retries)."""
        from airflow.exceptions import AirflowFailException

        from imgest.errors import ConfigError
        from imgest.ingest_flow import validate_conf

        try:
            return validate_conf(dict(params or {}))
        except ConfigError as exc:
            raise AirflowFailException(str(exc)) from None

    @task
    def scan(request: dict[str, Any]) -> dict[str, Any]:
        from imgest.ingest_flow import scan_step

        return scan_step(request)

    @task.branch
    def choose_target(request: dict[str, Any]) -> str:
        return "prepare_cassandra" if request["target"] == "cassandra" else "prepare_bucket"

    prepare_cassandra = ApplyCqlSchemaOperator(
        task_id="prepare_cassandra",
        manifest_dir=MANIFEST_DIR,
        keyspace="{{ params.keyspace }}",
        table_layout="{{ params.table_layout }}",
        table_suffix="{{ params.table_suffix }}",
        replication="{{ params.replication }}",
    )
    ingest_cassandra = ImgestSparkSubmitOperator(
        task_id="ingest_cassandra",
        job="ingest_cassandra",
        credentials_conn_id="cassandra_default",
        application_args=CASSANDRA_ARGS,
    )
    verify_cassandra = VerifyCassandraOperator(
        task_id="verify_cassandra",
        manifest_dir=MANIFEST_DIR,
        keyspace="{{ params.keyspace }}",
        table_layout="{{ params.table_layout }}",
        table_suffix="{{ params.table_suffix }}",
    )
    prepare_bucket = EnsureBucketOperator(task_id="prepare_bucket", dest="{{ params.s3_dest }}")
    ingest_shards = ImgestSparkSubmitOperator(
        task_id="ingest_shards",
        job="pack_shards",
        credentials_conn_id="aws_default",
        application_args=SHARDS_ARGS,
    )
    verify_shards = VerifyShardsOperator(task_id="verify_shards", dest="{{ params.s3_dest }}")

    build_split = BuildSplitOperator(
        task_id="build_split",
        request="{{ ti.xcom_pull(task_ids='validate') }}",
        out_dir=MANIFEST_DIR,
        trigger_rule="none_failed_min_one_success",
    )

    @task(outlets=[DATASETS])
    def publish_asset(request: dict[str, Any], *, outlet_events: Any = None) -> str:
        """Announce the verified dataset as an Asset (keyspace/table or S3 prefix)."""
        from imgest.ingest_flow import asset_uri

        uri = asset_uri(request)
        outlet_events[DATASETS].add(Asset(uri), extra={"dataset": request["dataset"], "target": request["target"]})
        return uri

    request = validate()
    scanned = scan(request)
    branch = choose_target(request)
    scanned >> branch
    branch >> prepare_cassandra >> ingest_cassandra >> verify_cassandra
    branch >> prepare_bucket >> ingest_shards >> verify_shards
    [verify_cassandra, verify_shards] >> build_split >> publish_asset(request)
