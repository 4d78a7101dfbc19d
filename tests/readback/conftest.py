"""One small dataset stored every way by the project's own jobs, for the read-back tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from imgest.cli import main as cli
from imgest.core.settings import CassandraSettings
from imgest.services import CassandraServer, S3Server
from imgest.sinks.cassandra.schema import TableLayout
from imgest.sources.devdata.sample import SampleSpec, write_sample

KEYSPACE = "imgest_readback_test"
DATASET = "rbtest"


def step_settings(stored: dict[str, Any]) -> dict[str, Any]:
    """The settings read_throughput_step takes, for the dataset the `stored` fixture wrote."""
    return {
        "cassandra": stored["cassandra"],
        "s3": stored["s3_settings"],
        "tables": TableLayout(KEYSPACE),
        "dataset": DATASET,
    }


@pytest.fixture(scope="session")
def stored(
    tmp_path_factory: pytest.TempPathFactory, cassandra_server: CassandraServer, s3_server: S3Server
) -> dict[str, Any]:
    """The same generated images as a Cassandra version, shards in a folder and on S3, and files. The Cassandra
    version goes through the bulk path (SSTables streamed in), so every reader here, the plugin's included, reads
    what the bulk loader wrote; the CQL path's tables are read in tests/jobs and tests/dags."""
    root = tmp_path_factory.mktemp("readback")
    src = root / "src"
    write_sample(src, SampleSpec("imagefolder", classes=3, per_class=20, val_per_class=2, seed=11, large_every=0))
    base = [str(src), "--work-dir", str(root / "work"), "--dataset", DATASET, "--master", "local[2]"]
    s3_dest = "s3://imgest/tests/readback"
    bulk = ["--verify", "--write-path", "bulk"]
    steps = [
        ["ingest", "files", *base, "--dest", str(root / "files")],
        ["ingest", "shards", *base, "--dest", str(root / "shards"), "--max-count", "16"],
        ["ingest", "shards", *base, "--dest", s3_dest, "--max-count", "16"],
        ["ingest", "cassandra", *base, "--keyspace", KEYSPACE, "--port", str(cassandra_server.native_port), *bulk],
    ]
    from imgest.sinks.cassandra.client import cassandra_session

    with cassandra_session(
        CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)
    ) as session:
        session.execute(f"DROP KEYSPACE IF EXISTS {KEYSPACE}", timeout=60)  # a version left by an earlier run
    for argv in steps:
        assert cli(argv) == 0, argv
    written = json.loads((root / "work" / "ingest_cassandra.json").read_text())["write_path"]
    assert written["path"] == "bulk", written
    return {
        "root": root,
        "files": root / "files",
        "shards": root / "shards",
        "s3": s3_dest,
        "cassandra": CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port),
        "s3_settings": s3_server.settings(),
        "train": 60,
    }


@pytest.fixture
def copy_of(tmp_path: Path):
    import shutil

    def make(src: Path) -> Path:
        dst = tmp_path / src.name
        shutil.copytree(src, dst)
        return dst

    return make
