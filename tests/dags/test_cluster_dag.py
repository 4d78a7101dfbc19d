"""`airflow dags test ingest_imagenet` with `spark_default` pointing at the Spark standalone cluster: both
Spark targets run there unchanged, executors' environments stay clean, and no secret of the connections
reaches a log, the Spark event log or the process list."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imgest.core.paths import state_dir
from imgest.core.settings import CassandraSettings
from imgest.flow.demo import run_dag, task_durations
from imgest.services import AirflowServer, S3Server
from imgest.services.spark_cluster import SparkCluster
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sources.devdata.sample import SampleSpec, write_sample
from tests.cluster_watch import ClusterWatch, assert_clean

pytestmark = [pytest.mark.services, pytest.mark.slow]
STORED = 3 * 4 + 3 * 2  # train + val, no planted defects


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("clusterdagsrc")
    write_sample(root, SampleSpec("cls-loc", classes=3, per_class=4, val_per_class=2, seed=41))
    return root


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
    source: Path,
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
    dag_conf = {"target": "cassandra", "source": str(source), "dataset": "dagcluster-c", "keyspace": ks}
    dag_conf["read_check"] = False  # the readers are tested on their own (tests/readback); this is about the cluster
    with ClusterWatch(on_cluster) as watch:
        ok, _, tail = run_dag(airflow_home, dag_conf)
    assert ok, tail
    states = _states(airflow_home)
    for task in ("prepare_cassandra", "ingest_cassandra", "verify_cassandra", "build_split", "publish_asset"):
        assert states[task] == "success", (task, states)
    with cassandra_session(settings) as session:
        assert session.execute(f"SELECT count(*) FROM {ks}.data").one()[0] == STORED
        assert session.execute(f"SELECT status FROM {ks}.dataset_versions").one().status == "complete"
    logs = [airflow_home.home / "logs", state_dir() / "work" / "dagcluster-c", event_log]
    assert_clean(watch, on_cluster, [password], logs)


def test_shards_target_on_the_cluster(
    airflow_home: AirflowServer, on_cluster: SparkCluster, s3_server: S3Server, source: Path, event_log: Path
) -> None:
    key, secret = s3_server.credentials()
    dest = "s3://imgest/tests/dag-cluster-shards"
    dag_conf = {"target": "shards", "source": str(source), "dataset": "dagcluster-s", "s3_dest": dest}
    dag_conf["shard_max_count"] = 5
    dag_conf["read_check"] = False  # the readers are tested on their own (tests/readback); this is about the cluster
    with ClusterWatch(on_cluster) as watch:
        ok, _, tail = run_dag(airflow_home, dag_conf)
    assert ok, tail
    states = _states(airflow_home)
    for task in ("prepare_bucket", "ingest_shards", "verify_shards", "build_split", "publish_asset"):
        assert states[task] == "success", (task, states)
    client = s3_server.settings().client()
    doc = json.loads(client.get_object(Bucket="imgest", Key="tests/dag-cluster-shards/manifest.json")["Body"].read())
    assert sum(doc["samples"].values()) == STORED
    assert all(s["samples"] <= 5 for s in doc["shards"])
    logs = [airflow_home.home / "logs", state_dir() / "work" / "dagcluster-s", event_log]
    assert_clean(watch, on_cluster, [key, secret], logs)
