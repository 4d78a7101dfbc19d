"""The steps of the `ingest_imagenet` DAG as ordinary functions (the DAG only wires them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from imgest.ingest_request import IngestRequest
from imgest.paths import state_dir
from imgest.sample import SampleSpec, write_sample
from imgest.scan import scan_to_dir

DEMO_SAMPLE = SampleSpec("cls-loc", classes=10, per_class=20, val_per_class=5, seed=0, defects=True)


def validate_conf(conf: dict[str, Any]) -> dict[str, Any]:
    """The validated request as a plain dict (ConfigError lists every problem)."""
    return IngestRequest.from_conf(conf).as_dict()


def source_path(request: IngestRequest) -> Path:
    """The dataset to ingest; with no source given, the embedded sample (generated once)."""
    if request.source:
        return Path(request.source)
    root = state_dir() / "demo" / request.dataset
    if not (root / "LOC_val_solution.csv").is_file():
        write_sample(root, DEMO_SAMPLE)
    return root


def scan_step(conf: dict[str, Any]) -> dict[str, Any]:
    """Scan the source into the work folder; returns the manifest folder and each job's arguments."""
    request = IngestRequest.from_conf(conf)
    manifest_dir = state_dir() / "work" / request.dataset
    report = scan_to_dir(source_path(request), manifest_dir, request.layout, request.dataset)
    return {
        "manifest_dir": str(manifest_dir),
        "summary": report.summary_line(),
        "cassandra_args": cassandra_job_args(request, manifest_dir),
        "shards_args": shards_job_args(request, manifest_dir),
    }


def _transform_args(request: IngestRequest) -> list[str]:
    return [
        "--mode",
        request.image_mode.lower(),
        "--resize",
        str(request.resize),
        "--crop",
        str(request.crop),
        "--quality",
        str(request.quality),
    ]


def cassandra_job_args(request: IngestRequest, manifest_dir: Path) -> list[str]:
    """Arguments of jobs/ingest_cassandra.py for REQUEST (hosts and port come from the connection)."""
    return [
        "--manifest-dir",
        str(manifest_dir),
        "--summary-json",
        str(manifest_dir / "ingest_cassandra.json"),
        "--dataset",
        request.dataset,
        "--keyspace",
        request.keyspace,
        "--replication",
        request.replication,
        "--table-layout",
        request.table_layout,
        "--table-suffix",
        request.table_suffix,
        "--partitions",
        str(request.spark_partitions),
        *_transform_args(request),
    ]


def shards_job_args(request: IngestRequest, manifest_dir: Path) -> list[str]:
    """Arguments of jobs/pack_shards.py for REQUEST."""
    return [
        "--manifest-dir",
        str(manifest_dir),
        "--summary-json",
        str(manifest_dir / "pack_shards.json"),
        "--dataset",
        request.dataset,
        "--dest",
        request.s3_dest,
        "--max-count",
        str(request.shard_max_count),
        "--max-bytes",
        str(request.shard_max_bytes),
        "--seed",
        str(request.shuffle_seed),
        "--partitions",
        str(request.spark_partitions),
        *_transform_args(request),
    ]


def asset_uri(conf: dict[str, Any], cassandra_address: str = "127.0.0.1:9042") -> str:
    """The Asset a finished run publishes: the Cassandra tables or the shard prefix."""
    request = IngestRequest.from_conf(conf)
    if request.target == "shards":
        return request.s3_dest if request.s3_dest.startswith("s3://") else f"file://{request.s3_dest}"
    tables = request.tables()
    return f"cassandra://{cassandra_address}/{request.keyspace}/{tables.data_table('train')}"
