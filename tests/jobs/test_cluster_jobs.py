"""Both jobs on the Spark standalone cluster (`imgest services up spark`) from the CLI, with workers whose
environment holds nothing of imgest's: executors get code, credentials and endpoints from the submission.

While each job runs, a watcher records every executor's environment and `ps -eo args`; afterwards every
log, the Spark event log and those snapshots are searched for the secrets.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from imgest.cli import main
from imgest.core.settings import CassandraSettings
from imgest.services.s3 import S3Server
from imgest.services.spark_cluster import SparkCluster
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sources.devdata.sample import SampleSpec, write_sample
from tests.cluster_watch import ClusterWatch, assert_clean

pytestmark = [pytest.mark.services, pytest.mark.slow]
STORED = 18 + 6 + 8  # train + val + the eight awkward-but-valid planted images
QUARANTINED = 5


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("clustersrc")
    write_sample(root, SampleSpec("cls-loc", classes=3, per_class=6, val_per_class=2, seed=31, defects=True))
    return root


def test_cassandra_ingest_on_the_cluster(
    tmp_path: Path,
    spark_cluster: SparkCluster,
    cassandra_role: tuple[CassandraSettings, str],
    source: Path,
    event_log: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings, password = cassandra_role
    ks = "imgest_test_cluster"
    with cassandra_session(settings) as session:
        session.execute(f"DROP KEYSPACE IF EXISTS {ks}", timeout=60)
    for name in ("IMGEST_CASSANDRA_USER", "IMGEST_CASSANDRA_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    pw_file = tmp_path / "pw"
    pw_file.write_text(password)
    work = tmp_path / "work"
    argv = ["ingest", "cassandra", str(source), "--work-dir", str(work), "--master", spark_cluster.master_url]
    argv += ["--keyspace", ks, "--port", str(settings.port), "--user", str(settings.username)]
    argv += ["--password-file", str(pw_file)]
    argv += ["--consistency", "ONE", "--partitions", "6", "--verify"]
    with ClusterWatch(spark_cluster) as watch:
        assert main(argv) == 0
    with cassandra_session(settings) as session:
        stored = session.execute(f"SELECT count(*) FROM {ks}.data").one()[0]
        record = session.execute(f"SELECT status, quarantine_count FROM {ks}.dataset_versions").one()
    assert stored == STORED
    assert (record.status, record.quarantine_count) == ("complete", QUARANTINED)
    summary = json.loads((work / "ingest_cassandra.json").read_text())
    assert summary["stored"] == STORED
    assert_clean(watch, spark_cluster, [password], [work, event_log])
    assert list(event_log.iterdir()), "the Spark event log was not written"


def test_shard_pack_on_the_cluster(
    tmp_path: Path, spark_cluster: SparkCluster, s3_server: S3Server, source: Path, event_log: Path
) -> None:
    key, secret = s3_server.credentials()  # the access key too: it names the account
    dest = "s3://imgest/tests/cluster-shards"
    client = s3_server.settings().client()
    for obj in client.list_objects_v2(Bucket="imgest", Prefix="tests/cluster-shards/").get("Contents", []):
        client.delete_object(Bucket="imgest", Key=obj["Key"])
    work = tmp_path / "work"
    argv = ["ingest", "shards", str(source), "--work-dir", str(work), "--master", spark_cluster.master_url]
    argv += ["--dest", dest, "--max-count", "10"]
    with ClusterWatch(spark_cluster) as watch:
        assert main(argv) == 0
    doc: dict[str, Any] = json.loads(
        client.get_object(Bucket="imgest", Key="tests/cluster-shards/manifest.json")["Body"].read()
    )
    assert sum(doc["samples"].values()) == STORED
    assert doc["quarantine"]["count"] == QUARANTINED + 1  # the manifest also lists the scan's no-label file
    assert all(s["samples"] <= 10 for s in doc["shards"])
    listed = {o["Key"] for o in client.list_objects_v2(Bucket="imgest", Prefix="tests/cluster-shards/")["Contents"]}
    assert all(f"tests/cluster-shards/{s['path']}" in listed for s in doc["shards"])
    assert main(["verify", "shards", dest]) == 0
    assert_clean(watch, spark_cluster, [key, secret], [work, event_log])
    assert list(event_log.iterdir()), "the Spark event log was not written"


def test_one_session_per_process_and_settings(cassandra_role: tuple[CassandraSettings, str]) -> None:
    from dataclasses import replace

    from imgest.sinks.cassandra import client

    settings, _ = cassandra_role
    first = client.shared_session(settings)
    assert client.shared_session(replace(settings)) is first  # equal settings (as unpickled per task): reused
    other = client.shared_session(replace(settings, consistency="ONE"))
    assert other is not first
    assert other.execute("SELECT release_version FROM system.local").one() is not None
    client.close_shared_sessions()
    assert first.is_shutdown
    assert other.is_shutdown
    assert client.shared_session(settings) is not first  # a shut-down session is replaced, not handed out
    client.close_shared_sessions()
