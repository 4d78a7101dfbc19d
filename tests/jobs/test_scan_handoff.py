"""`imgest ingest cassandra SRC` starts its Spark job beside the scan (scan_handoff): the job reads the manifest
only once the scan is done, and a failed scan stops it before it touches the store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from imgest.core.settings import CassandraSettings
from imgest.services.cassandra import CassandraServer
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sources.devdata.sample import SampleSpec, write_sample

pytestmark = [pytest.mark.services, pytest.mark.slow]
IMGEST = str(Path(sys.executable).parent / "imgest")


def _ingest(src: Path, work: Path, server: CassandraServer, ks: str) -> subprocess.CompletedProcess[str]:
    argv = [IMGEST, "ingest", "cassandra", str(src), "--work-dir", str(work), "--keyspace", ks, "--master", "local[2]"]
    argv += ["--port", str(server.native_port)]
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)


def _tables(server: CassandraServer, ks: str) -> set[str]:
    with cassandra_session(CassandraSettings(hosts=(server.host,), port=server.native_port)) as session:
        rows = session.execute("SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s", (ks,))
        return {r.table_name for r in rows}


def _drop(server: CassandraServer, ks: str) -> None:
    with cassandra_session(CassandraSettings(hosts=(server.host,), port=server.native_port)) as session:
        session.execute(f"DROP KEYSPACE IF EXISTS {ks}", timeout=120)


def test_the_job_reads_the_manifest_its_command_scanned_beside_it(
    tmp_path: Path, cassandra_server: CassandraServer
) -> None:
    ks = "imgest_test_scan_handoff"
    _drop(cassandra_server, ks)
    write_sample(tmp_path / "src", SampleSpec("imagefolder", classes=2, per_class=5, val_per_class=2, seed=5))
    done = _ingest(tmp_path / "src", tmp_path / "w", cassandra_server, ks)
    assert done.returncode == 0, done.stderr[-3000:]
    summary: dict[str, Any] = json.loads((tmp_path / "w" / "ingest_cassandra.json").read_text())
    assert "scan_wait_s" in summary  # the job was started beside the scan and waited for it (if at all)
    assert summary["candidates"] == 14  # every row the scan listed
    assert summary["stored"] == 14
    assert list((tmp_path / "w").glob(".scan-*")) == []
    _drop(cassandra_server, ks)


def test_a_failed_scan_stops_the_job_before_the_store(tmp_path: Path, cassandra_server: CassandraServer) -> None:
    ks = "imgest_test_scan_handoff_failed"
    _drop(cassandra_server, ks)
    (tmp_path / "src" / "n01").mkdir(parents=True)
    (tmp_path / "src" / "n01" / "README.txt").write_text("no image here\n")
    done = _ingest(tmp_path / "src", tmp_path / "w", cassandra_server, ks)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith("imgest: error: nothing is ingestible in ")
    assert "the scan failed, so nothing was ingested" in (tmp_path / "w" / "spark-cassandra.log").read_text()
    assert _tables(cassandra_server, ks) == {"imgest_locks"}  # the run's lock alone: no schema, no version record
    assert list((tmp_path / "w").glob(".scan-*")) == []
