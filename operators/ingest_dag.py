"""The ingest_imagenet DAG as a factory: :func:`ingest_imagenet_dag` builds it with the DAG id, connection ids, Spark
pool, tags and default arguments a platform gives (in the spirit of astronomer-cosmos' ``DbtDag``). The shipped DAG
file (dags/ingest_imagenet.py) calls it with the defaults; a deployment's own file may call it as often as it needs::

    from imgest.operators.dag_connections import DagConnections
    from imgest.operators.ingest_dag import ingest_imagenet_dag

    ingest_team_b = ingest_imagenet_dag(
        "ingest_team_b", connections=DagConnections(cassandra="cassandra_b", aws="s3_b", spark="spark_b")
    )

Trigger from the UI's form or: airflow dags trigger <dag_id> --conf '{"sample": true, "target": "shards"}'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import DAG, Param, task

from imgest.flow.request_form import param_specs
from imgest.operators.cassandra import ApplyCqlSchemaOperator, VerifyCassandraOperator
from imgest.operators.config_options import export_section
from imgest.operators.dag_connections import DEFAULT, START_DATE, DagConnections, caller_file, dag_defaults
from imgest.operators.dataset_lock import DatasetLockOperator
from imgest.operators.publish import DATASETS, MANIFEST_DIR, SOURCE_CONN, announce
from imgest.operators.readback import ReadThroughputOperator
from imgest.operators.s3 import CollectGarbageOperator, EnsureBucketOperator, VerifyFilesOperator
from imgest.operators.spark import (
    CassandraIngestSubmitOperator,
    PackShardsSubmitOperator,
    VerifyShardsSubmitOperator,
    WriteFilesSubmitOperator,
)
from imgest.operators.splits import BuildSplitOperator
from imgest.operators.validate import ValidateXnvmeOperator
from imgest.operators.workarea import work_hooks

REQUEST = "{{ ti.xcom_pull(task_ids='validate') }}"
CASSANDRA_ARGS = "{{ ti.xcom_pull(task_ids='scan')['cassandra_args'] }}"
SHARDS_ARGS = "{{ ti.xcom_pull(task_ids='scan')['shards_args'] }}"
FILES_ARGS = "{{ ti.xcom_pull(task_ids='scan')['files_args'] }}"
SHARD_DEST = "{{ ti.xcom_pull(task_ids='validate')['s3_dest'] or 's3://imgest/' ~ params.dataset }}"
FILES_DEST = "{{ ti.xcom_pull(task_ids='scan')['files_dest'] }}"
DATASET = "{{ (ti.xcom_pull(task_ids='validate') or {}).get('dataset', '') }}"
CHECK_SAMPLE = "{{ ti.xcom_pull(task_ids='validate')['check_sample'] }}"

DOC = """
### Ingest an ImageNet-style dataset

Press **Trigger**, open **Source** and either fill **Source dataset** (a folder or `ILSVRC2012_img_train.tar` the
worker can read) or switch on **Use the generated sample**; every other field has a working default. Open
**Target** to choose where the images go.

- **cassandra**: tables `data` (`id uuid, label int, data blob`, the cassandra-dali-plugin layout), `metadata`
  (label, wnid, split, size, sha256), `quarantine` and a `dataset_versions` row (`complete` once verified), in
  the *Keyspace* on connection `cassandra_default` (`data_<split>` with *Table layout* per-split, *Table suffix*
  appended). Read back with the cassandra-dali-plugin reader and the row ids of `split-cassandra.npz` (or its
  crs4 `split-cassandra.pckl`).
- **shards**: webdataset shards `{split}-{index:06d}.tar` (`.jpg`, `.cls`, `.json` per sample), a DALI `.idx` per
  shard and `manifest.json` (written last) at the *Shard destination* (`s3://imgest/<dataset>` when empty) on
  connection `aws_default`, or in a folder. Read back from `manifest.json` with
  `fn.readers.webdataset(paths=tars, index_paths=idxs, ext=["jpg", "cls"])` or `webdataset.WebDataset(urls)`.
- **files**: `<split>/<wnid>/<id>.jpg` (the tree DALI `fn.readers.file` reads) with `samples.parquet` and
  `manifest.json` (written last), under *Files destination* (default `$IMGEST_HOME/files/<dataset>`). Read back with
  `fn.readers.file` or plain file I/O.

After the split file, `read_throughput` reads a seeded, class-balanced sample of the stored train rows (*Images
checked*; 0: every row) back through DALI with every reader of the target (raw bytes and a CPU training
pipeline), hashing every sample read against its ingest sha256, within *Read-back seconds* and at most 10 % of the
run (the report names the readers the budget cut, with their rates and why); for the files
target `validate_xnvme` then reads them with DALI's file reader, the Python file API and xNVMe's file and block
APIs. Reports and plots land in the work folder and are referenced from the version record.

Every target writes the work folder `$IMGEST_HOME/work/<dataset>/` (`manifest.parquet`, `quarantine.json`, the
Spark job's summary, `split-<target>.npz`) and announces the result as an Asset through the `imgest-datasets` alias
(`cassandra://host:port/<keyspace>/<data table>`, the shard prefix or `file://` folder): see **Assets**. Load a
split with `imgest.splits.load_split("split-<target>.npz").part(0)`.

Values outside a field's bounds or pattern are refused when you press Trigger (the form shows why, no run starts).
Settings that only fail together (a crop larger than the resize, a source *and* the sample) fail **validate**
before any Spark work: its log's first line lists every problem.
"""

VALIDATE_DOC = """Checks every setting together (source or sample, crop within resize, destination, ratios, ...).
On a problem it fails at once, without retries: the first line of its log lists every problem, and no Spark
work starts."""


def _params(connections: DagConnections) -> dict[str, Param]:
    """The trigger form's fields, the source connection's default the DAG's."""
    specs = param_specs()
    specs["source_conn_id"] = {**specs["source_conn_id"], "default": connections.source}
    return {name: Param(**spec) for name, spec in specs.items()}


def ingest_imagenet_dag(
    dag_id: str = "ingest_imagenet",
    *,
    connections: DagConnections = DEFAULT,
    spark_pool: str | None = None,
    tags: Sequence[str] = ("imgest", "ingest"),
    default_args: dict[str, Any] | None = None,
    max_active_runs: int = 8,
    **dag_kwargs: Any,
) -> DAG:
    """The ingest DAG under DAG_ID, reaching Cassandra, S3 (destination and run state), an s3:// source without a
    connection of its own and Spark through CONNECTIONS; its Spark jobs in SPARK_POOL (None: $IMGEST_SPARK_POOL, else
    default_pool); TAGS; DEFAULT_ARGS over imgest's (retries, timeouts, the work-folder hooks); MAX_ACTIVE_RUNS
    (runs of different datasets proceed together; the dataset lock keeps one writer each); DAG_KWARGS to the DAG."""
    export_section()  # [imgest] of Airflow's configuration (its spark_pool, ...), as the variables not set
    conns = connections
    spark = {"conn_id": conns.spark, **({"pool": spark_pool} if spark_pool else {})}
    hooks = work_hooks(aws_conn_id=conns.aws, cassandra_conn_id=conns.cassandra, spark_conn_id=conns.spark)
    with DAG(
        dag_id=dag_id,
        description="ImageNet-style dataset -> Cassandra tables or webdataset shards, verified",
        doc_md=DOC,
        schedule=None,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=max_active_runs,
        render_template_as_native_obj=True,
        tags=list(tags),
        default_args=dag_defaults(12, hooks, conns.task_ids(), default_args),  # hooks: the work folder's travel
        params=_params(conns),
        **dag_kwargs,
    ) as dag:
        dag.fileloc = caller_file()  # the DAG file that called the factory (caller_file says why)
        request, scanned, lock = _front(conns)
        branch = _choose_target(request)
        scanned >> branch
        verified = [
            _cassandra_branch(branch, spark),
            _shards_branch(branch, spark, conns),
            _files_branch(branch, spark),
        ]
        _after(request, verified, lock, conns)
    return dag


def _front(conns: DagConnections) -> tuple[Any, Any, Any]:
    """validate -> lock -> scan: the run's request, the scan's result and the lock task."""

    @task(doc_md=VALIDATE_DOC)
    def validate(params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Reject bad conf with every problem listed, before any Spark work (AirflowFailException: no retries)."""
        import logging

        from imgest.core.errors import ConfigError
        from imgest.flow.steps import validate_conf
        from imgest.operators.compat import fail_exception
        from imgest.operators.hooks import connection_bucket
        from imgest.operators.state import task_deployment

        try:  # a run across hosts also needs a store for its state (IMGEST_STATE_URL, or its S3 destination)
            deployment, bucket = task_deployment(conns.spark), connection_bucket(conns.aws)
            return validate_conf(dict(params or {}), deployment, bucket=bucket)
        except ConfigError as exc:
            # The first line of this task's log, and the failure shown for the run: what to fix, nothing else.
            logging.getLogger(__name__).error("%s", exc)
            raise fail_exception()(str(exc)) from None

    @task(doc_md="Lists images, labels and ids into `manifest.parquet` in `$IMGEST_HOME/work/<dataset>/`.")
    def scan(request: dict[str, Any]) -> dict[str, Any]:
        """Scan the source; nothing ingestible fails at once (no retries), naming the quarantine list."""
        from imgest.flow.steps import scan_step
        from imgest.operators.failures import fail_without_retry
        from imgest.operators.hooks import source_settings, state_store

        with fail_without_retry():
            source = source_settings(request.get("source"), request.get("source_conn_id", ""))
            return scan_step(request, source, state_store(conns.aws))

    lock = DatasetLockOperator(
        task_id="lock", dataset=DATASET, doc_md="One writer per dataset (DAG runs and CLI): waits for the holder."
    )
    request = validate()
    scanned = scan(request)
    request >> lock >> scanned
    return request, scanned, lock


@task.branch(task_id="choose_target", doc_md="Follows the Target: the other branch's tasks are skipped, not failed.")
def _choose_target(request: dict[str, Any]) -> str:
    return {"cassandra": "prepare_cassandra", "shards": "prepare_bucket", "files": "ingest_files"}[request["target"]]


def _spark_job(kind: type, task_id: str, args: str | list[str], doc: str, spark: dict[str, Any]) -> Any:
    """A target's Spark job: its source's connection, the dataset whose lock it holds, its arguments from the scan,
    the DAG's Spark connection and pool."""
    return kind(
        task_id=task_id, source_conn_id=SOURCE_CONN, lock_dataset=DATASET, application_args=args, doc_md=doc, **spark
    )


def _cassandra_branch(branch: Any, spark: dict[str, Any]) -> Any:
    """prepare_cassandra -> ingest_cassandra -> verify_cassandra; returns the last."""
    prepare = ApplyCqlSchemaOperator(
        task_id="prepare_cassandra",
        request=REQUEST,
        manifest_dir=MANIFEST_DIR,
        doc_md="Creates the keyspace (replication from the form) and the tables from `sql/*.cql`.",
    )
    doc = f"Spark job `jobs/ingest_cassandra.py` on `{spark['conn_id']}`: transforms and writes the rows."
    ingest = _spark_job(CassandraIngestSubmitOperator, "ingest_cassandra", CASSANDRA_ARGS, doc, spark)
    verify = VerifyCassandraOperator(
        task_id="verify_cassandra",
        request=REQUEST,
        manifest_dir=MANIFEST_DIR,
        doc_md="Checks counts per split and label and byte-equal samples; marks the version `complete`.",
    )
    branch >> prepare >> ingest >> verify
    return verify


def _shards_branch(branch: Any, spark: dict[str, Any], conns: DagConnections) -> Any:
    """prepare_bucket -> ingest_shards -> verify_shards; returns the last."""
    prepare = EnsureBucketOperator(
        task_id="prepare_bucket",
        dest=SHARD_DEST,
        doc_md=f"Checks the keys of `{conns.aws}` and creates the bucket (skipped for a folder).",
    )
    doc = "Spark job `jobs/pack_shards.py`: writes shards under `v/<key>/`, publishes by writing `manifest.json`."
    ingest = _spark_job(PackShardsSubmitOperator, "ingest_shards", SHARDS_ARGS, doc, spark)
    doc = "Spark job `jobs/verify_shards.py`: the executors check every shard of `manifest.json` (sha256, size)."
    verify = _spark_job(VerifyShardsSubmitOperator, "verify_shards", ["--dest", SHARD_DEST], doc, spark)
    branch >> prepare >> ingest >> verify
    return verify


def _files_branch(branch: Any, spark: dict[str, Any]) -> Any:
    """ingest_files -> verify_files; returns the last."""
    doc = "Spark job: write <split>/<wnid>/<id>.jpg files."
    ingest = _spark_job(WriteFilesSubmitOperator, "ingest_files", FILES_ARGS, doc, spark)
    verify = VerifyFilesOperator(
        task_id="verify_files",
        dest=FILES_DEST,
        sample=CHECK_SAMPLE,
        doc_md="Counts match; every file is there with its size; a seeded sample (Images checked) has its sha256.",
    )
    branch >> ingest >> verify
    return verify


def _after(request: Any, verified: list[Any], lock: Any, conns: DagConnections) -> None:
    """build_split -> read_throughput -> publish_asset -> gc, the files target's xNVMe check, and release_lock as the
    teardown of lock (it runs whatever happened)."""
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
    validate_xnvme = ValidateXnvmeOperator(
        task_id="validate_xnvme",
        dataset_dir=FILES_DEST,
        out_dir=MANIFEST_DIR,
        loop_fs="{{ ti.xcom_pull(task_ids='validate')['xnvme_loop_fs'] or '' }}",
        sample=CHECK_SAMPLE,
        doc_md="DALI file reader vs Python file API vs xNVMe file and block APIs, byte-exact.",
    )
    gc = CollectGarbageOperator(
        task_id="gc",
        request=REQUEST,
        manifest_dir=MANIFEST_DIR,
        doc_md="Deletes the stored versions older than the published one and *Earlier versions kept* before it "
        "(never what manifest.json names); returns what it removed. The Cassandra target keeps its versions in its "
        "tables: nothing to collect.",
    )
    release = DatasetLockOperator(task_id="release_lock", dataset=DATASET, release=True, retries=3)
    published = _publish_asset(request, conns)
    verified >> build_split >> read_throughput >> published
    read_throughput >> _xnvme_applies(request) >> validate_xnvme
    published >> gc
    [published, validate_xnvme, gc] >> release.as_teardown(setups=lock)  # runs whatever happened; not the run's state


@task.short_circuit(
    task_id="xnvme_applies",
    ignore_downstream_trigger_rules=False,
    doc_md="The xNVMe check applies to the files target.",
)
def _xnvme_applies(request: dict[str, Any]) -> bool:
    return request["target"] == "files"


def _publish_asset(request: Any, conns: DagConnections) -> Any:
    @task(
        task_id="publish_asset",
        outlets=[DATASETS],
        doc_md="Announces the verified dataset as an Asset (tables, shard prefix or folder).",
    )
    def publish_asset(request: dict[str, Any], *, outlet_events: Any = None) -> str:
        """Announce the verified dataset as an Asset (keyspace/table or S3 prefix)."""
        extra = {"dataset": request["dataset"], "target": request["target"], "checked": True}  # read back above
        return announce(request, extra, outlet_events, conns)

    return publish_asset(request)
