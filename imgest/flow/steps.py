"""The steps of the `ingest_imagenet` DAG as ordinary functions (the DAG and its operators only wire them).

Each step takes the validated request (a plain dict, as it travels through XCom) and typed connection
settings; none reads an Airflow connection itself.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imgest.core import defaults, workdir
from imgest.core.errors import ImgestError
from imgest.core.lock_stores import state_setting
from imgest.core.paths import state_dir
from imgest.core.run_state import SHARED_ENV, Deployment, check_shared, state_url_for
from imgest.core.settings import CassandraSettings, S3Settings
from imgest.flow.request import IngestRequest

log = logging.getLogger(__name__)


def validate_conf(
    conf: dict[str, Any], deployment: Deployment | None = None, bucket: str | None = None
) -> dict[str, Any]:
    """The validated request as a plain dict (ConfigError lists every problem), its shard destination resolved
    (s3_dest, else s3://BUCKET/<dataset> with BUCKET the connection's, else $IMGEST_S3_BUCKET), so every task of the
    run writes where this one said. With DEPLOYMENT (an Airflow task's), also where the run's state will live: a run
    across hosts with no store every host reaches is refused (ConfigError naming IMGEST_STATE_URL)."""
    dataset = conf.get("dataset") or defaults.DATASET  # the form's default when the trigger names none
    if bucket and conf.get("target") == "shards" and not conf.get("s3_dest") and isinstance(dataset, str):
        conf = {**conf, "s3_dest": defaults.shard_dest(dataset, bucket)}
    parsed = IngestRequest.from_conf(conf)
    request = parsed.as_dict()
    if parsed.target == "shards":
        request["s3_dest"] = parsed.shard_dest
    if deployment is not None:
        url = state_url_for(deployment, s3_destination(request), state_setting())
        check_shared(deployment, local_folders(IngestRequest.from_conf(conf), url), os.environ.get(SHARED_ENV, ""))
    return request


def local_folders(request: IngestRequest, state_url: str | None) -> dict[str, str]:
    """The local folders a run of REQUEST reads or writes on every host (its state at STATE_URL): a local source
    (the sample too, unless the scan copies it to an S3 state store) and the files target's folder."""
    folders = {}
    if request.source and not request.source.startswith("s3://"):
        folders["the source folder"] = os.path.abspath(request.source)
    elif request.sample and not (state_url or "").startswith("s3://"):
        folders["the generated sample in"] = str(state_dir() / "demo")
    if request.target == "files":
        folders["the files target's folder"] = os.path.abspath(request.files_location)
    return folders


def s3_destination(conf: dict[str, Any]) -> str | None:
    """The run's destination on S3 (the shards target's s3:// one), where its state may live; None without one."""
    request = IngestRequest.from_conf(conf)
    dest = request.shard_dest if request.target == "shards" else ""
    return dest if dest.startswith("s3://") else None


def source_path(request: IngestRequest) -> Path:
    """The dataset to ingest: the given source, or the generated sample when asked for explicitly."""
    if request.source:
        return Path(request.source)
    from imgest.sources.devdata.sample import DEMO_SAMPLE, ensure_sample

    return ensure_sample(state_dir() / "demo" / request.dataset, DEMO_SAMPLE)


@dataclass(frozen=True)
class StateStore:
    """Where a run that spans hosts keeps its state: the ``s3://`` URL, the Airflow connection that reaches it and
    that connection's settings."""

    url: str
    conn_id: str
    settings: S3Settings


def scan_step(
    conf: dict[str, Any], source: S3Settings | None = None, state: StateStore | None = None
) -> dict[str, Any]:
    """Scan the source into the dataset's work folder; returns the folder, where the source is and the connection
    that reads it, and each job's arguments.

    SOURCE: the connection of an s3:// source (from ``source_conn_id``); None reads the IMGEST_SOURCE_* variables.
    STATE: the run's state store when its state is in object storage (hosts that share no disk): a run of the
    generated sample then reads its copy there, so every host and executor reaches it.
    """
    from imgest.sources.s3source import is_s3, register_source
    from imgest.sources.scan import scan_to_dir

    request = IngestRequest.from_conf(conf)
    manifest_dir = workdir.dataset_workdir(request.dataset)
    on_s3 = bool(request.source) and is_s3(request.source or "")
    conn_id = request.source_conn_id if on_s3 else ""
    if on_s3 and source is not None:
        register_source(request.source or "", source)
    src: str | Path = request.source if on_s3 else source_path(request)
    if request.sample and state is not None:
        from imgest.sources.devdata.sample_store import sample_on_store

        src, conn_id = sample_on_store(Path(src), state.url, request.dataset, state.settings), state.conn_id
        register_source(src, state.settings)
    report = scan_to_dir(src or "", manifest_dir, request.layout, request.dataset)
    return {
        "manifest_dir": str(manifest_dir),
        "summary": report.summary_line(),
        "source_root": str(src) if conn_id else "",
        "source_conn_id": conn_id,
        "cassandra_args": cassandra_job_args(request, manifest_dir),
        "shards_args": shards_job_args(request, manifest_dir) if request.target == "shards" else [],  # has a dest
        "files_args": files_job_args(request, manifest_dir),
        "files_dest": request.files_location,
    }


def _transform_args(request: IngestRequest) -> list[str]:
    spec = request.transform()
    sizes = ["--resize", str(spec.resize), "--crop", str(spec.crop), "--quality", str(spec.quality)]
    return ["--mode", spec.mode, *sizes, "--unchanged-check", spec.unchanged_check, "--jpeg-decoder", spec.jpeg_decoder]


def _common_args(request: IngestRequest, manifest_dir: Path, target: str) -> list[str]:
    return [
        *("--manifest-dir", str(manifest_dir)),
        *("--summary-json", str(manifest_dir / workdir.job_summary(target))),
        *("--dataset", request.dataset),
        *("--partitions", str(request.spark_partitions)),
        *_transform_args(request),
    ]


def cassandra_job_args(request: IngestRequest, manifest_dir: Path) -> list[str]:
    """Arguments of jobs/ingest_cassandra.py for REQUEST (hosts and port come from the connection)."""
    tables = request.tables()
    return [
        *_common_args(request, manifest_dir, "cassandra"),
        *("--keyspace", tables.keyspace, "--replication", request.replication),
        *("--table-layout", tables.layout, "--table-suffix", tables.suffix),
        *("--write-path", request.write_path),
    ]


def shards_job_args(request: IngestRequest, manifest_dir: Path) -> list[str]:
    """Arguments of jobs/pack_shards.py for REQUEST."""
    spec = request.shards()
    return [
        *_common_args(request, manifest_dir, "shards"),
        *("--dest", request.shard_dest, "--max-count", str(spec.max_count)),
        *("--max-bytes", str(spec.max_bytes), "--seed", str(spec.seed)),
    ]


def files_job_args(request: IngestRequest, manifest_dir: Path) -> list[str]:
    """Arguments of jobs/write_files.py for REQUEST."""
    return [*_common_args(request, manifest_dir, "files"), "--dest", request.files_location]


def scanned_splits(manifest_dir: Path) -> list[str]:
    """The splits a scan found, sorted."""
    return sorted(json.loads((manifest_dir / workdir.SCAN_REPORT).read_text())["per_split"])


def prepare_cassandra(conf: dict[str, Any], manifest_dir: Path, settings: CassandraSettings) -> list[str]:
    """Create the keyspace and tables for the splits the scan found (idempotent); returns the statements."""
    from imgest.sinks.cassandra.client import cassandra_session
    from imgest.sinks.cassandra.schema import apply_schema

    request = IngestRequest.from_conf(conf)
    with cassandra_session(settings) as session:  # refused credentials: CassandraAuthError, before any Spark work
        return apply_schema(session, request.tables(), scanned_splits(manifest_dir), request.replication)


def verify_cassandra(conf: dict[str, Any], manifest_dir: Path, settings: CassandraSettings, sample: int) -> dict:
    """The counts the job recorded against the manifest and the job's summary, and a byte-equal sample of the
    version the job wrote (no table scan); marks it complete or raises."""
    from imgest.sinks.cassandra.client import cassandra_session
    from imgest.sinks.cassandra.verify import VerificationError, verify

    request = IngestRequest.from_conf(conf)
    job = json.loads((manifest_dir / workdir.CASSANDRA_SUMMARY).read_text())
    written = job["stored"] + job["skipped_already_committed"]
    with cassandra_session(settings) as session:
        report = verify(session, manifest_dir, request.tables(), None, job["version"], sample, job_rows=written)
    log.info("verification: %s", json.dumps(report.to_dict()))
    if not report.ok:
        raise VerificationError(f"Cassandra data does not match the manifest: {report.to_dict()}")
    return report.to_dict()


def prepare_bucket(dest: str, settings: S3Settings | None) -> str:
    """Create DEST's bucket when DEST is on S3 and the bucket is missing; clear error on refused keys."""
    from imgest.flow.preflight import check_shard_dest

    if settings is not None:
        from imgest.sinks.shards.s3_client import ensure_bucket

        ensure_bucket(settings, dest[5:].split("/", 1)[0])  # refused keys: S3AuthError, before any Spark work
    check_shard_dest(dest, settings)
    return dest


def verify_shards(dest: str, settings: S3Settings | None, hash_kept: bool = True) -> dict[str, Any]:
    """Every shard listed in DEST's manifest.json is there with its sha256, or ShardVerificationError (HASH_KEPT
    False: the shards kept from earlier versions with their size, see sinks.shards.verify)."""
    from imgest.sinks.shards.store import open_store
    from imgest.sinks.shards.verify import ShardVerificationError
    from imgest.sinks.shards.verify import verify_shards as verify_store

    report = verify_store(open_store(dest, settings), hash_kept=hash_kept)
    log.info("verification: %s", json.dumps(report.to_dict()))
    if not report.ok:
        raise ShardVerificationError(f"published shards do not match manifest.json: {report.to_dict()}")
    return report.to_dict()


def verify_files(dest: str, sample: int = defaults.CHECK_SAMPLE) -> dict[str, Any]:
    """Counts of DEST's samples.parquet match manifest.json, every listed file is there with its size, and a seeded,
    class-balanced SAMPLE of each split (0: every file) has its sha256; or FilesVerificationError."""
    from imgest.sinks.files.verify import FilesVerificationError
    from imgest.sinks.files.verify import verify_files as verify_tree

    report = verify_tree(Path(dest), sample)
    log.info("verification: %s", json.dumps(report.to_dict()))
    if not report.ok:
        raise FilesVerificationError(f"files under {dest} do not match samples.parquet: {report.to_dict()}")
    return report.to_dict()


def collect_garbage(conf: dict[str, Any], s3: S3Settings | None, manifest_dir: Path | None = None) -> dict[str, Any]:
    """After a publish: remove what the shards or files dataset of CONF no longer needs, keeping the version its
    manifest names and ``keep_versions`` earlier ones; returns what was removed (the Cassandra target: nothing to
    collect). With MANIFEST_DIR, the shard plan key the run's pack job published (its summary there) must still be
    the live one, else nothing is removed. The caller holds the dataset's write lock, so no job of this dataset is
    writing an unpublished version: unreferenced objects are collected whatever their age; a caller that lost it
    removes nothing (LockLostError)."""
    from imgest.core.locks import check_fence

    request = IngestRequest.from_conf(conf)
    if request.target != "cassandra":
        check_fence(request.dataset)
    if request.target == "shards":
        from imgest.sinks.shards.gc import collect
        from imgest.sinks.shards.store import open_store

        store = open_store(request.shard_dest, s3)
        summary = manifest_dir / workdir.SHARDS_SUMMARY if manifest_dir else None
        published = json.loads(summary.read_text()).get("key") if summary and summary.is_file() else None
        current = (store.read_manifest() or {}).get("key")
        if published and current != published:
            log.warning(
                "gc of %s: manifest.json names %s, not %s (this run's): nothing removed",
                store.location,
                current,
                published,
            )
            return {"target": "shards", "current": current, "skipped": f"manifest.json no longer names {published}"}
        report = collect(store, keep=request.keep_versions, min_age=0.0).to_dict()
    elif request.target == "files":
        from imgest.sinks.files.gc import collect_files

        report = collect_files(Path(request.files_location), keep=request.keep_versions).to_dict()
    else:
        return {"target": request.target, "skipped": "the cassandra target keeps its versions in its tables"}
    log.info("gc of %s (%d earlier versions kept): %s", request.location, request.keep_versions, report)
    return {"target": request.target, "keep_versions": request.keep_versions, **report}


def read_throughput(
    conf: dict[str, Any],
    out_dir: Path,
    cassandra: CassandraSettings | None,
    s3: S3Settings | None,
    run_seconds: float | None = None,
    spent: float = 0.0,
) -> dict[str, Any]:
    """Read a seeded, class-balanced sample of the stored train rows (request.check_sample images; 0: every row)
    back through DALI with every reader of the target, within request.check_seconds and, after RUN_SECONDS of a
    run (None: not in one) of CHECK_SHARE_FROM_IMAGES train images or more, CHECK_RUN_SHARE of the run less the SPENT
    seconds the task has already run (imgest.readback.budget.check_seconds); report, record, verify."""
    from imgest.readback.check import ReadCheckOptions
    from imgest.readback.step import read_throughput_step

    request = IngestRequest.from_conf(conf)
    if not request.read_check:
        return {"skipped": "read_check is off"}
    settings = {"cassandra": cassandra, "s3": s3, "tables": request.tables(), "dataset": request.dataset}
    spent = round(spent, 2)  # as the result records it, so the budget follows from the result's own figures
    opts = ReadCheckOptions(
        sample=request.check_sample, seconds=request.check_seconds, run_seconds=run_seconds, spent=spent
    )
    result = read_throughput_step(request.target, request.location, out_dir, settings, opts)
    return {**result, "run_seconds": run_seconds, "task_seconds_before": spent}


def build_split(
    conf: dict[str, Any], out_dir: Path, cassandra: CassandraSettings | None, s3: S3Settings | None
) -> dict[str, Any]:
    """Split the ingested train rows into parts; writes split-<target>.npz (+ the crs4 .pckl for Cassandra)."""
    from imgest.splits.split import parse_ratios, write_split_files

    request = IngestRequest.from_conf(conf)
    rows = _train_rows(request, cassandra, s3)
    out = out_dir / workdir.split_file(request.target)
    split = write_split_files(
        rows,
        parse_ratios(request.split_ratios),
        request.split_balance,
        request.split_seed,
        out,
        crs4=request.target == "cassandra",
        settings={"split_of": "train"},
    )
    summary = split.summary()
    log.info("split %s: parts %s, unused %s", out, summary["parts"], summary["unused"])
    return {"path": str(out), "parts": summary["parts"], "unused": summary["unused"]}


def _train_rows(request: IngestRequest, cassandra: CassandraSettings | None, s3: S3Settings | None) -> Any:
    from imgest.splits.sources import from_cassandra, from_shards

    if request.target in ("shards", "files"):  # both publish samples.parquet (id, label, split)
        from imgest.sinks.files.layout import data_root
        from imgest.sinks.shards.store import open_store

        if request.target == "shards":
            return from_shards(open_store(request.shard_dest, s3), only_split="train")
        return from_shards(open_store(str(data_root(Path(request.files_location)))), only_split="train")
    if cassandra is None:
        raise ImgestError("the Cassandra target needs Cassandra settings to read its rows")
    from imgest.sinks.cassandra.client import cassandra_session

    tables = request.tables()
    with cassandra_session(cassandra) as session:
        return from_cassandra(
            session,
            f"{tables.keyspace}.{tables.metadata_table('train')}",
            f"{tables.keyspace}.{tables.data_table('train')}",
            only_split="train",
            dataset=request.dataset,
        )


def asset_uri(conf: dict[str, Any], cassandra_address: str) -> str:
    """The Asset a finished run publishes: the Cassandra tables (at CASSANDRA_ADDRESS) or the shard prefix."""
    request = IngestRequest.from_conf(conf)
    if request.target != "cassandra":
        dest = request.location
        return dest if dest.startswith("s3://") else f"file://{dest}"
    tables = request.tables()
    return f"cassandra://{cassandra_address}/{request.keyspace}/{tables.data_table('train')}"
