"""`airflow dags test ingest_imagenet` for both targets against the real services, and bad conf."""

from __future__ import annotations

import json
import pickle
import sqlite3
from pathlib import Path

import pytest

from imgest.cassandra_client import cassandra_session
from imgest.demo import run_dag, task_durations
from imgest.errors import ConfigError
from imgest.ingest_flow import validate_conf
from imgest.paths import state_dir
from imgest.sample import SampleSpec, write_sample
from imgest.services import AirflowServer, CassandraServer, S3Server
from imgest.settings import CassandraSettings
from imgest.splits import load_split

pytestmark = [pytest.mark.services, pytest.mark.slow]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dagsrc")
    write_sample(root, SampleSpec("cls-loc", classes=3, per_class=6, val_per_class=2, seed=31, defects=True))
    return root


def _states(airflow: AirflowServer) -> dict[str, str | None]:
    return {task: state for task, state, _ in task_durations(airflow, "ingest_imagenet")}


def test_cassandra_target(airflow_home: AirflowServer, cassandra_server: CassandraServer, source: Path) -> None:
    conf = {"target": "cassandra", "source": str(source), "dataset": "dagtest-c", "keyspace": "imgest_dag_test"}
    with cassandra_session(CassandraSettings(port=cassandra_server.native_port)) as session:
        session.execute("DROP KEYSPACE IF EXISTS imgest_dag_test", timeout=60)
    ok, _, tail = run_dag(airflow_home, conf)
    assert ok, tail
    states = _states(airflow_home)
    for task in (
        "validate",
        "scan",
        "choose_target",
        "prepare_cassandra",
        "ingest_cassandra",
        "verify_cassandra",
        "build_split",
        "publish_asset",
    ):
        assert states[task] == "success", (task, states)
    assert states["ingest_shards"] == "skipped"
    with cassandra_session(CassandraSettings(port=cassandra_server.native_port)) as session:
        record = session.execute("SELECT status, quarantine_count FROM imgest_dag_test.dataset_versions").one()
        stored = session.execute("SELECT count(*) FROM imgest_dag_test.data").one()[0]
    assert record.status == "complete"
    assert record.quarantine_count == 5
    assert stored == 18 + 6 + 8  # train + val + the eight awkward-but-valid planted images
    with sqlite3.connect(airflow_home.home / "airflow.db") as db:
        uris = [r[0] for r in db.execute("SELECT uri FROM asset")]
    assert "cassandra://127.0.0.1:9042/imgest_dag_test/data" in uris
    split = load_split(state_dir() / "work" / "dagtest-c" / "split-cassandra.npz")
    # train rows: class 0 has 6 + the 8 planted images, classes 1 and 2 have 6; 8:2 cuts are [11,3], [5,1], [5,1]
    assert [len(p) for p in split.parts] == [21, 5]
    assert split.source["metadata_table"] == "imgest_dag_test.metadata"
    with open(state_dir() / "work" / "dagtest-c" / "split-cassandra.pckl", "rb") as fh:
        assert pickle.load(fh)["num_classes"] == 3


def test_shards_target(airflow_home: AirflowServer, s3_server: S3Server, source: Path) -> None:
    dest = "s3://imgest/tests/dag-shards"
    conf = {"target": "shards", "source": str(source), "dataset": "dagtest-s", "s3_dest": dest, "shard_max_count": 10}
    ok, _, tail = run_dag(airflow_home, conf)
    assert ok, tail
    states = _states(airflow_home)
    for task in ("prepare_bucket", "ingest_shards", "verify_shards", "build_split", "publish_asset"):
        assert states[task] == "success", (task, states)
    assert states["ingest_cassandra"] == "skipped"
    client = s3_server.settings().client()
    doc = json.loads(client.get_object(Bucket="imgest", Key="tests/dag-shards/manifest.json")["Body"].read())
    assert sum(doc["samples"].values()) == 18 + 6 + 8
    assert all(s["samples"] <= 10 for s in doc["shards"])
    split = load_split(state_dir() / "work" / "dagtest-s" / "split-shards.npz")
    assert [len(p) for p in split.parts] == [21, 5]  # every train sample, cut 8:2 per class
    assert split.source["location"] == dest


def test_bad_conf_fails_before_any_spark_work(airflow_home: AirflowServer) -> None:
    conf = {"target": "shards", "crop": 300, "resize": 256, "s3_dest": "http://not-s3", "split_ratios": "8,-2"}
    ok, _, _ = run_dag(airflow_home, conf)
    assert not ok
    states = _states(airflow_home)
    assert states["validate"] == "failed"
    assert states.get("scan") in (None, "upstream_failed")
    assert states.get("ingest_shards") in (None, "upstream_failed")


def test_bad_conf_message_lists_every_problem() -> None:
    with pytest.raises(ConfigError) as err:
        validate_conf({"target": "shards", "crop": 300, "s3_dest": "http://x", "split_ratios": "8,-2", "colour": 1})
    message = str(err.value)
    for part in (
        "unknown setting 'colour'",
        "crop 300 must be between 1 and resize 256",
        "s3_dest 'http://x'",
        "split_ratios '8,-2'",
    ):
        assert part in message


def test_param_outside_its_schema_is_refused(airflow_home: AirflowServer) -> None:
    ok, _, tail = run_dag(airflow_home, {"target": "hdfs"})
    assert not ok
    assert "hdfs" in tail
