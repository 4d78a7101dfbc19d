"""`airflow dags test ingest_imagenet` with `spark_default` pointing at the Spark standalone cluster: the Cassandra
target runs there unchanged, from a source that exists only on S3 (read through `source_conn_id`: no file system
is shared), executors' environments stay clean, and no secret of the connections (Cassandra's password, S3's
keys) reaches a log, the Spark event log or the process list. The read-back check is off: it runs in the Airflow
task, not on the cluster, and tests/dags/test_ingest_dag.py runs it for each target. The shard pack on the
cluster from an S3 source the workers reach only through the task is tests/jobs/test_s3_sources.py's, the DAG's
shard branch tests/dags/test_ingest_dag.py's: one DAG run on the cluster covers what the DAG adds (the
connection naming the cluster). The source holds the planted defects, so the quarantine runs on the executors
too; the CLI's way to the cluster (`--master spark://...`) is tests/jobs/test_s3_sources.py's and
tests/integration/test_cassandra_tls.py's."""

from __future__ import annotations

import io
import json
import secrets
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from imgest.core.paths import state_dir
from imgest.core.settings import CassandraSettings
from imgest.flow.demo import run_dag, task_durations, task_results
from imgest.services import AirflowServer, CassandraServer, S3Server
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
    dag_conf["source_conn_id"] = "aws_default"
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


def _published(client: Any, prefix: str) -> list[tuple[str, int, str]]:
    doc = json.loads(client.get_object(Bucket="imgest", Key=f"{prefix}manifest.json")["Body"].read())
    return sorted((s["name"], s["samples"], s["sha256"]) for s in doc["shards"])


def _arrays(data: bytes) -> dict[str, Any]:
    """A split file's arrays, its metadata without the location of the stored version (which differs by design)."""
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        arrays: dict[str, Any] = {name: npz[name].tolist() for name in npz.files}
    meta = json.loads(arrays.pop("meta"))
    meta["source"].pop("location")
    return {**arrays, "meta": meta}


def test_no_shared_disk_between_tasks_or_executors(
    airflow_home: AirflowServer,
    on_cluster: SparkCluster,
    s3_server: S3Server,
    cassandra_server: CassandraServer,
    source: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each task starts with an empty work folder (IMGEST_WORKAREA_EPHEMERAL) and the Spark workers cannot see
    the Airflow side's work folders: with $IMGEST_STATE_URL the shard run stores what the one-machine run stores
    (same tars, same split file) and the Cassandra run completes; told the hosts share a disk when they do not
    (IMGEST_STATE_URL=local), the first task that needs an earlier task's file fails naming it."""
    client, run, dataset = s3_server.settings().client(), secrets.token_hex(3), "dagnsd"
    conf = {
        "target": "shards",
        "source": source,
        "dataset": dataset,
        "read_check": False,
        "source_conn_id": "aws_default",
    }
    work = state_dir() / "work"
    with monkeypatch.context() as local:  # the reference: one machine, local master, the work folder on disk
        local.delenv("AIRFLOW_CONN_SPARK_DEFAULT")
        ok, _, tail = run_dag(airflow_home, {**conf, "s3_dest": f"s3://imgest/tests/dagnsd-ref-{run}"})
        assert ok, tail
    reference_split = (work / dataset / "split-shards.npz").read_bytes()
    hidden = replace(on_cluster, hide=(str(work),))
    hidden.restart_workers()
    try:
        monkeypatch.setenv("IMGEST_WORKAREA_EPHEMERAL", "1")
        monkeypatch.setenv("IMGEST_STATE_URL", "local")  # unset, the state would go beside the S3 destination
        lost = {**conf, "s3_dest": f"s3://imgest/tests/dagnsd-lost-{run}"}
        proc = airflow_home.airflow("dags", "test", "ingest_imagenet", "--conf", json.dumps(lost), check=False)
        assert proc.returncode != 0
        assert _states(airflow_home)["ingest_shards"] == "failed"
        out = (proc.stdout or "") + (proc.stderr or "")
        assert f"{work / dataset}/" in out  # the file the task looked for, which an earlier task wrote elsewhere

        state = f"tests/dagnsd-state-{run}"
        monkeypatch.setenv("IMGEST_STATE_URL", f"s3://imgest/{state}")
        ok, _, tail = run_dag(airflow_home, {**conf, "s3_dest": f"s3://imgest/tests/dagnsd-{run}"})
        assert ok, tail
        ok, _, tail = run_dag(airflow_home, {**conf, "target": "cassandra", "keyspace": f"dagnsd_{run}"})
        assert ok, tail
    finally:
        on_cluster.restart_workers()
    assert _published(client, f"tests/dagnsd-{run}/") == _published(client, f"tests/dagnsd-ref-{run}/")
    split = client.get_object(Bucket="imgest", Key=f"{state}/work/{dataset}/split-shards.npz")["Body"].read()
    assert _arrays(split) == _arrays(reference_split)
    assert not (work / dataset).exists()  # nothing of the run stayed on the "pod's" disk
    assert list(list_objects(client, "imgest", f"{state}/staging/")) == []
    assert list(list_objects(client, "imgest", f"{state}/locks/")) == []  # the runs let go of the dataset's lock
    with cassandra_session(
        CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)
    ) as session:
        assert session.execute(f"SELECT count(*) FROM dagnsd_{run}.data").one()[0] == STORED


def _upload_tree(client: Any, root: Path, prefix: str) -> None:
    """ROOT's files as objects under s3://imgest-src/PREFIX, whatever was there before removed."""
    for obj in list_objects(client, SOURCE_BUCKET, prefix):
        client.delete_object(Bucket=SOURCE_BUCKET, Key=obj.key)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        client.upload_file(str(path), SOURCE_BUCKET, prefix + path.relative_to(root).as_posix())


def _change_source(client: Any, prefix: str) -> None:
    """One train image rewritten with other bytes, one added, one removed (the same change for every run)."""
    keys = sorted(o.key for o in list_objects(client, SOURCE_BUCKET, prefix + "train/"))
    first, second, last = keys[0], keys[1], keys[-1]
    other = client.get_object(Bucket=SOURCE_BUCKET, Key=second)["Body"].read()
    client.put_object(Bucket=SOURCE_BUCKET, Key=first, Body=other)
    client.put_object(Bucket=SOURCE_BUCKET, Key=first.rsplit("/", 1)[0] + "/added.JPEG", Body=other + b"\0")
    client.delete_object(Bucket=SOURCE_BUCKET, Key=last)


def _refresh_twice(airflow: AirflowServer, client: Any, root: Path, prefix: str) -> list[dict[str, Any]]:
    """refresh_rfnsd on the source as written (version 1), then after _change_source (version 2); each version's
    plan (added, changed, removed, unchanged)."""
    _upload_tree(client, root, prefix)
    plans = []
    for change in (False, True):
        if change:
            _change_source(client, prefix)
        proc = airflow.airflow("dags", "test", "refresh_rfnsd", check=False)
        assert proc.returncode == 0, (proc.stdout or "")[-3000:] + (proc.stderr or "")[-3000:]
        plans.append(task_results(airflow, "refresh_rfnsd", ("shards.plan",))["shards.plan"]["counts"])
    return plans


def test_refresh_of_a_changed_s3_source_without_shared_disk(
    airflow_home: AirflowServer,
    on_cluster: SparkCluster,
    s3_server: S3Server,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """refresh_<name> of a source on S3, a first version and one after a change, each task on an empty disk and the
    executors on workers that see none of the Airflow side's folders: the plans and the published shards (names,
    samples, sha256, dead samples) equal those of the same two refreshes on one machine."""
    client, run = s3_server.settings().client(), secrets.token_hex(3)
    root, prefix = tmp_path / "src", f"tests/refresh-nsd-{run}/"
    write_sample(root, SampleSpec("imagefolder", classes=3, per_class=4, val_per_class=1, seed=43))
    work = state_dir() / "work"

    def register(dest: str) -> None:
        path = tmp_path / f"datasets-{dest.rsplit('/', 1)[1]}.toml"
        path.write_text(
            f'[datasets.rfnsd]\nsource = "s3://{SOURCE_BUCKET}/{prefix}"\nlayout = "imagefolder"\n'
            f'targets = ["shards"]\nschedule = "0 0 29 2 *"\ns3_dest = "{dest}"\nshard_max_count = 4\n'
            'source_conn_id = "aws_default"\n'
        )
        monkeypatch.setenv("IMGEST_DATASETS_FILE", str(path))

    with monkeypatch.context() as local:  # the reference: one machine, local master, the work folder on disk
        local.delenv("AIRFLOW_CONN_SPARK_DEFAULT")
        register(f"s3://imgest/tests/rfnsd-ref-{run}")
        reference = _refresh_twice(airflow_home, client, root, prefix)
    shutil.rmtree(work / "rfnsd", ignore_errors=True)
    hidden = replace(on_cluster, hide=(str(work),))
    hidden.restart_workers()
    try:
        monkeypatch.setenv("IMGEST_WORKAREA_EPHEMERAL", "1")
        monkeypatch.setenv("IMGEST_STATE_URL", f"s3://imgest/tests/rfnsd-state-{run}")
        register(f"s3://imgest/tests/rfnsd-{run}")
        plans = _refresh_twice(airflow_home, client, root, prefix)
    finally:
        on_cluster.restart_workers()
    assert plans == reference
    assert plans[1] == {"added": 1, "changed": 1, "removed": 1, "unchanged": plans[0]["added"] - 2}
    assert _published(client, f"tests/rfnsd-{run}/") == _published(client, f"tests/rfnsd-ref-{run}/")
    assert not (work / "rfnsd").exists()  # nothing of the runs stayed on the "pod's" disk
