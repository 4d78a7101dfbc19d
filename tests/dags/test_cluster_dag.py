"""`airflow dags test ingest_imagenet` with `spark_default` pointing at the Spark standalone cluster: the Cassandra
target runs there unchanged, from a source that exists only on S3 (read through `source_conn_id`: no file system
is shared), executors' environments stay clean, and no secret of the connections (Cassandra's password, S3's
keys) reaches a log, the Spark event log or the process list (the bulk path's helper JVMs on the executors
included: their command lines are read from /proc while they run). The read-back check is off: it runs in the Airflow
task, not on the cluster, and tests/dags/test_ingest_dag.py runs it for each target. The shard pack on the
cluster from an S3 source the workers reach only through the task is tests/jobs/test_s3_sources.py's, the DAG's
shard branch tests/dags/test_ingest_dag.py's: one DAG run on the cluster covers what the DAG adds (the
connection naming the cluster). The source holds the planted defects, so the quarantine runs on the executors
too; the CLI's way to the cluster (`--master spark://...`) is tests/jobs/test_s3_sources.py's and
tests/integration/test_cassandra_tls.py's. Runs through the real scheduler on hosts that share no disk (Celery
workers and Spark workers of their own, a refresh of a changed S3 source among them) are tests/dags/test_hosts.py's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from imgest.core.paths import state_dir
from imgest.core.settings import CassandraSettings
from imgest.services import AirflowServer, S3Server
from imgest.services.demo import run_dag, task_durations
from imgest.services.spark_cluster import SparkCluster
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.s3objects import list_objects
from tests.cluster_watch import ClusterWatch, assert_clean

pytestmark = [pytest.mark.services, pytest.mark.slow]
STORED = 3 * 4 + 3 * 2 + 8  # train + val + the eight awkward-but-valid planted images
QUARANTINED = 5  # the planted undecodable, truncated, empty, too-large and wrong-format files


SOURCE_BUCKET, SOURCE_PREFIX = "imgest-src", "tests/cluster-dag-source/"


@pytest.fixture(scope="module")
def source(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The sample uploaded to S3; the local copy is deleted, so only S3 can serve it."""
    root = tmp_path_factory.mktemp("clusterdagsrc")
    write_sample(root, SampleSpec("cls-loc", classes=3, per_class=4, val_per_class=2, seed=41, defects=True))
    client = s3_server.settings().client()
    if SOURCE_BUCKET not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket=SOURCE_BUCKET)
    for obj in list_objects(client, SOURCE_BUCKET, SOURCE_PREFIX):
        client.delete_object(Bucket=SOURCE_BUCKET, Key=obj.key)
    for path in sorted(root.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), SOURCE_BUCKET, SOURCE_PREFIX + path.relative_to(root).as_posix())
    shutil.rmtree(root)
    return f"s3://{SOURCE_BUCKET}/{SOURCE_PREFIX}"


@pytest.fixture
def on_cluster(spark_cluster: SparkCluster, monkeypatch: pytest.MonkeyPatch) -> SparkCluster:
    """spark_default (an environment connection, which Airflow reads before its database) names the cluster."""
    conn = {"conn_type": "spark", "host": f"spark://{spark_cluster.host}", "port": spark_cluster.port}
    conn["extra"] = {"deploy-mode": "client", "spark-binary": "spark-submit"}
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(conn))
    return spark_cluster


def _states(airflow: AirflowServer) -> dict[str, str | None]:
    return {task: state for task, state, _ in task_durations(airflow, "ingest_imagenet")}


def test_cassandra_target_on_the_cluster(
    airflow_home: AirflowServer,
    on_cluster: SparkCluster,
    cassandra_role: tuple[CassandraSettings, str],
    s3_server: S3Server,
    source: str,
    event_log: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings, password = cassandra_role
    ks = "imgest_dag_cluster"
    with cassandra_session(settings) as session:
        session.execute(f"DROP KEYSPACE IF EXISTS {ks}", timeout=60)
    conn = {"conn_type": "cassandra", "host": "127.0.0.1", "port": settings.port, "login": settings.username}
    conn |= {"password": password, "extra": {"consistency": "ONE", "local_dc": "datacenter1"}}
    monkeypatch.setenv("AIRFLOW_CONN_CASSANDRA_DEFAULT", json.dumps(conn))
    dag_conf = {"target": "cassandra", "source": source, "dataset": "dagcluster-c", "keyspace": ks, "read_check": False}
    dag_conf |= {"source_conn_id": "aws_default", "write_path": "bulk"}  # helper JVMs on the executors hold a login
    # the cluster's workers run on this machine and see its disk: the run's state may stay there (without this, a
    # Cassandra run on a cluster master, with no S3 destination, is refused by validate: tests/unit/test_run_state.py)
    monkeypatch.setenv("IMGEST_STATE_URL", "local")
    with ClusterWatch(on_cluster) as watch:
        ok, _, tail = run_dag(airflow_home, dag_conf)
    assert ok, tail
    states = _states(airflow_home)
    for task in ("scan", "ingest_cassandra", "verify_cassandra", "build_split", "publish_asset"):
        assert states[task] == "success", (task, states)
    with cassandra_session(settings) as session:
        assert session.execute(f"SELECT count(*) FROM {ks}.data").one()[0] == STORED
        record = session.execute(f"SELECT status, quarantine_count FROM {ks}.dataset_versions").one()
    assert (record.status, record.quarantine_count) == ("complete", QUARANTINED)
    logs = [airflow_home.home / "logs", state_dir() / "work" / "dagcluster-c", event_log]
    assert_clean(watch, on_cluster, [password, *s3_server.credentials()], logs)
    helpers = watch.helpers()  # their command lines, read from /proc while they ran, hold none of the secrets
    assert helpers, "no bulk-load helper JVM was seen below the workers"
    assert not [c for c in helpers.values() if password in c or any(k in c for k in s3_server.credentials())]
