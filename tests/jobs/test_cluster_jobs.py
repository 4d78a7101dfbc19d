"""Both jobs on the Spark standalone cluster (`imgest services up spark`) from the CLI, with workers whose
environment holds nothing of imgest's: executors get code, credentials and endpoints from the submission.

While each job runs, a watcher records every executor's environment and `ps -eo args`; afterwards every
log, the Spark event log and those snapshots are searched for the secrets.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from imgest.cli import main
from imgest.core.settings import CassandraSettings
from imgest.services.cassandra import CassandraServer
from imgest.services.s3 import S3Server
from imgest.services.spark_cluster import SparkCluster
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sources.devdata.sample import SampleSpec, write_sample
from tests.cluster_watch import ClusterWatch, files_holding
from tests.conftest import serve

pytestmark = [pytest.mark.services, pytest.mark.slow]
STORED = 18 + 6 + 8  # train + val + the eight awkward-but-valid planted images
QUARANTINED = 5


@pytest.fixture(scope="module")
def spark_cluster() -> Iterator[SparkCluster]:
    yield from serve(SparkCluster.default())  # type: ignore[misc]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("clustersrc")
    write_sample(root, SampleSpec("cls-loc", classes=3, per_class=6, val_per_class=2, seed=31, defects=True))
    return root


@pytest.fixture(scope="module")
def cassandra_role(cassandra_auth_server: CassandraServer) -> tuple[CassandraSettings, str]:
    """A login role with a random password on the password-checking node: (settings, password)."""
    password = "pw" + secrets.token_hex(12)
    admin = CassandraSettings(port=cassandra_auth_server.native_port, username="cassandra", password="cassandra")
    with cassandra_session(admin) as session:
        session.execute(
            f"CREATE ROLE IF NOT EXISTS imgest_cluster WITH LOGIN = true AND SUPERUSER = true "
            f"AND PASSWORD = '{password}'"
        )
        session.execute(f"ALTER ROLE imgest_cluster WITH PASSWORD = '{password}'")
    return (
        CassandraSettings(port=cassandra_auth_server.native_port, username="imgest_cluster", password=password),
        password,
    )


@pytest.fixture
def event_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """spark-submit reads SPARK_CONF_DIR/spark-defaults.conf: the event log goes to a folder of this test."""
    conf, events = tmp_path / "spark-conf", tmp_path / "events"
    conf.mkdir()
    events.mkdir()
    (conf / "spark-defaults.conf").write_text(f"spark.eventLog.enabled true\nspark.eventLog.dir {events.as_uri()}\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf))
    return events


def _assert_clean(watch: ClusterWatch, cluster: SparkCluster, secret_values: list[str], logs: list[Path]) -> None:
    assert watch.executors(), "no executor was seen on the workers"
    assert watch.python_workers(), "no Python worker was seen on the workers"
    assert watch.leaked() == []
    paths = {env.get("PYTHONPATH", "") for env in watch.python_workers().values()}
    assert any("imgest-pyfiles.zip" in p for p in paths), paths  # the code came with the submission
    for snapshot in watch.ps_snapshots:
        assert not [s for s in secret_values if s in snapshot], "a secret appeared in `ps -eo args`"
    for env in (*watch.executors().values(), *watch.python_workers().values()):
        assert not [s for s in secret_values if s in "\n".join(env.values())]
    scanned = [*logs, cluster.home]
    assert files_holding(scanned, secret_values) == []


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
    argv += [
        "--keyspace",
        ks,
        "--port",
        str(settings.port),
        "--user",
        "imgest_cluster",
        "--password-file",
        str(pw_file),
    ]
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
    _assert_clean(watch, spark_cluster, [password], [work, event_log])
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
    assert doc["quarantine"]["count"] == QUARANTINED
    assert all(s["samples"] <= 10 for s in doc["shards"])
    listed = {o["Key"] for o in client.list_objects_v2(Bucket="imgest", Prefix="tests/cluster-shards/")["Contents"]}
    assert all(f"tests/cluster-shards/{s['name']}" in listed for s in doc["shards"])
    assert main(["verify", "shards", dest]) == 0
    _assert_clean(watch, spark_cluster, [key, secret], [work, event_log])
    assert list(event_log.iterdir()), "the Spark event log was not written"
