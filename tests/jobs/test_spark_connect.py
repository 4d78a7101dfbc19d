"""The Spark Connect route (`--master sc://...`, `imgest services up spark-connect`): every job runs as the thin
client of a Connect session on the standalone cluster, with no JVM beside it, and writes what the spark-submit
route writes on the same input: the same files, shards byte for byte (and verified on the executors), the same
Cassandra rows (CQL and bulk). A job
killed mid-way through Connect resumes like a spark-submit one."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from imgest.core.settings import CassandraSettings
from imgest.services import CassandraServer, S3Server
from imgest.services.spark_cluster import SparkCluster
from imgest.services.spark_connect import SparkConnectServer
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sinks.cassandra.schema import TableLayout
from imgest.sinks.cassandra.verify import verify
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.manifest import iter_manifest
from imgest.sources.scan import scan_to_dir
from imgest.spark.submit import submit_command, submit_env
from tests.cluster_watch import children
from tests.jobs.conftest import kill_when, read_summary

pytestmark = [pytest.mark.services, pytest.mark.slow]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("connect")
    write_sample(root / "src", SampleSpec("cls-loc", classes=3, per_class=12, val_per_class=3, seed=66, defects=True))
    scan_to_dir(root / "src", root / "manifest", dataset="connect")
    return root / "manifest"


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _run(job: str, args: list[str], master: str, env: dict[str, str]) -> tuple[int, str, set[str]]:
    """(exit code, output, the names of every process below the job while it ran) of jobs/JOB.py on MASTER."""
    cmd = submit_command(job, args, master)
    full = {**(submit_env(master) if master.startswith("spark://") else dict(os.environ)), **env}
    proc = subprocess.Popen(cmd, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: set[str] = set()

    def watch() -> None:
        while proc.poll() is None:
            seen.update(_comm(p) for p in children(proc.pid))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out, _ = proc.communicate(timeout=600)
    watcher.join()
    return proc.returncode, out, seen


def _shards(s3: S3Server, prefix: str) -> list[tuple[str, str, str]]:
    """(name, sha256 of the tar as stored, of its .idx) of every published shard, each downloaded."""
    client = s3.settings().client()
    doc = json.loads(client.get_object(Bucket="imgest", Key=f"{prefix}/manifest.json")["Body"].read())

    def sha(key: str) -> str:
        return hashlib.sha256(client.get_object(Bucket="imgest", Key=f"{prefix}/{key}")["Body"].read()).hexdigest()

    return sorted((s["name"], sha(s["path"]), sha(s["index"])) for s in doc["shards"])


def _rows(settings: CassandraSettings, keyspace: str) -> list[tuple[str, int, str, str]]:
    with cassandra_session(settings) as session:
        data = {
            r.id: hashlib.sha256(r.data).hexdigest() for r in session.execute(f"SELECT id, data FROM {keyspace}.data")
        }
        meta = session.execute(f"SELECT id, label, split FROM {keyspace}.metadata")
        return sorted((str(r.id), r.label, r.split, data[r.id]) for r in meta)


def _files(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def test_every_target_through_connect_writes_what_spark_submit_writes_with_no_jvm_beside_it(
    spark_connect: SparkConnectServer,
    spark_cluster: SparkCluster,
    cassandra_server: CassandraServer,
    s3_server: S3Server,
    manifest: Path,
    tmp_path: Path,
) -> None:
    run = secrets.token_hex(3)
    key, secret = s3_server.credentials()
    env = {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret, "IMGEST_S3_ENDPOINT": s3_server.endpoint}
    env["IMGEST_STATE_URL"] = "local"  # one machine's disk: the cluster's workers see the manifest's folder
    common = ["--manifest-dir", str(manifest), "--partitions", "4"]
    cassandra = ["--port", str(cassandra_server.native_port), "--consistency", "ONE"]
    routes = {"submit": spark_cluster.master_url, "connect": spark_connect.url}
    out: dict[str, dict[str, Any]] = {}
    for route, master in routes.items():
        jobs = {
            "files": ("write_files", ["--dest", str(tmp_path / f"files-{route}")]),
            "shards": ("pack_shards", ["--dest", f"s3://imgest/tests/connect-{route}-{run}"]),
            "cql": ("ingest_cassandra", ["--keyspace", f"connect_{route}_{run}", "--write-path", "cql", *cassandra]),
            "bulk": ("ingest_cassandra", ["--keyspace", f"connect_{route}_b{run}", "--write-path", "bulk", *cassandra]),
        }
        for name, (job, args) in jobs.items():
            summary = tmp_path / f"{route}-{name}.json"
            rc, log, below = _run(job, [*common, *args, "--summary-json", str(summary)], master, env)
            assert rc == 0, log[-3000:]
            out.setdefault(route, {})[name] = (read_summary(summary), below)
        # the shards just published, read back and hashed on the executors (issue #66)
        summary = tmp_path / f"{route}-verify.json"
        dest = f"s3://imgest/tests/connect-{route}-{run}"
        verify_args = ["--dest", dest, "--tasks", "2", "--summary-json", str(summary)]
        rc, log, below = _run("verify_shards", verify_args, master, env)
        assert rc == 0, log[-3000:]
        out[route]["verify"] = (read_summary(summary), below)
    for name in ("files", "shards", "cql", "bulk", "verify"):
        assert "java" in out["submit"][name][1]  # the control: the process watch sees spark-submit's driver JVM
        assert "java" not in out["connect"][name][1], (name, out["connect"][name][1])  # the thin client starts none
    assert _files(tmp_path / "files-connect") == _files(tmp_path / "files-submit")
    assert out["connect"]["shards"][0]["shards"] >= 2
    for route in routes:
        checked = out[route]["verify"][0]
        assert (checked["ok"], checked["shards"]) == (True, out[route]["shards"][0]["shards"])
        assert checked["hashed_bytes"] == checked["bytes"] > 0  # every byte hashed, by the executors
    assert _shards(s3_server, f"tests/connect-connect-{run}") == _shards(s3_server, f"tests/connect-submit-{run}")
    settings = CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)
    for name, suffix in (("cql", ""), ("bulk", "b")):
        assert out["connect"][name][0]["write_path"]["path"] == name
        stored = _rows(settings, f"connect_connect_{suffix}{run}")
        assert len(stored) == out["connect"][name][0]["stored"] > 0
        assert stored == _rows(settings, f"connect_submit_{suffix}{run}")


def test_a_job_killed_mid_way_through_connect_resumes(
    spark_connect: SparkConnectServer, cassandra_server: CassandraServer, tmp_path: Path
) -> None:
    """The thin client SIGKILLed with part of the rows written (the server interrupts its detached execution later,
    or lets it finish: rows are idempotent either way), then run again: every row once, verified."""
    ks = f"connect_resume_{secrets.token_hex(3)}"
    write_sample(tmp_path / "src", SampleSpec("imagefolder", classes=4, per_class=15, val_per_class=0, seed=67))
    manifest = tmp_path / "manifest"
    scan_to_dir(tmp_path / "src", manifest)
    total = sum(1 for _ in iter_manifest(manifest / "manifest.parquet"))
    settings = CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)
    args = ["--manifest-dir", str(manifest), "--keyspace", ks, "--partitions", "20", "--max-in-flight", "1"]
    args += ["--write-path", "cql", "--port", str(cassandra_server.native_port), "--consistency", "ONE"]
    env = {**os.environ, "IMGEST_STATE_URL": "local"}
    proc = subprocess.Popen(
        submit_command("ingest_cassandra", args, spark_connect.url),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def committed() -> int:
        try:
            with cassandra_session(settings) as session:
                return session.execute(f"SELECT count(*) FROM {ks}.metadata").one()[0]
        except Exception:  # the table does not exist yet
            return 0

    written = kill_when(proc, committed, lambda n: n >= 5)
    assert 0 < written < total, f"kill did not land mid-way ({written}/{total})"
    summary = tmp_path / "resumed.json"
    rc, log, below = _run("ingest_cassandra", [*args, "--summary-json", str(summary)], spark_connect.url, env)
    assert rc == 0, log[-3000:]
    assert "java" not in below
    resumed = read_summary(summary)
    assert resumed["stored"] + resumed["skipped_already_committed"] == total
    assert resumed["skipped_already_committed"] >= written
    with cassandra_session(settings) as session:
        assert session.execute(f"SELECT count(*) FROM {ks}.data").one()[0] == total
        assert verify(session, manifest, TableLayout(ks), None, resumed["version"], sample=5).ok
