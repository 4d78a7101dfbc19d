"""`airflow dags test ingest_imagenet` for the Cassandra and files targets against the real services, and bad conf.

The shards target runs in tests/packaging/test_provider.py, in the environments users install imgest into.
"""

from __future__ import annotations

import json
import pickle
import sqlite3
from pathlib import Path

import pytest

from imgest.core import defaults
from imgest.core.errors import ConfigError
from imgest.core.paths import state_dir
from imgest.core.settings import CassandraSettings
from imgest.flow.steps import asset_uri, validate_conf
from imgest.readback.budget import check_seconds
from imgest.services import AirflowServer, CassandraServer
from imgest.services.demo import run_dag, task_durations, task_results
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.splits.split import load_split

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
    with cassandra_session(
        CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)
    ) as session:
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
        "read_throughput",
        "publish_asset",
    ):
        assert states[task] == "success", (task, states)
    assert states["ingest_shards"] == "skipped"
    assert states["validate_xnvme"] == "skipped"  # the xNVMe check reads the files target only
    assert states["gc"] == "success"  # versions of the Cassandra target live in its tables: nothing removed
    assert "skipped" in task_results(airflow_home, "ingest_imagenet", ("gc",))["gc"]
    with cassandra_session(
        CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)
    ) as session:
        record = session.execute("SELECT status, quarantine_count FROM imgest_dag_test.dataset_versions").one()
        stored = session.execute("SELECT count(*) FROM imgest_dag_test.data").one()[0]
    assert record.status == "complete"
    assert record.quarantine_count == 5
    assert stored == 18 + 6 + 8  # train + val + the eight awkward-but-valid planted images
    with sqlite3.connect(airflow_home.home / "airflow.db") as db:
        uris = [r[0] for r in db.execute("SELECT uri FROM asset")]
    out = airflow_home.airflow("connections", "get", "cassandra_default", "-o", "json").stdout
    conn = json.loads(next(line for line in out.splitlines() if line.startswith("[")))[0]
    assert f"cassandra://{conn['host']}:{conn['port']}/imgest_dag_test/data" in uris
    with cassandra_session(
        CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)
    ) as session:
        checks = session.execute("SELECT checks FROM imgest_dag_test.dataset_versions").one().checks
    report = json.loads(Path(checks["read_throughput"]).read_text())
    assert {(r["reader"], r["mode"]) for r in report["readers"]} == {
        (reader, mode) for reader in ("cassandra", "cassandra-simple") for mode in ("raw", "train")
    }
    assert all(r["ok"] and r["images"] == 18 + 8 for r in report["readers"])  # every train row, verified
    assert (report["sample"], report["checked"], report["full_read"]) == (10_000, 18 + 8, True)  # default sample
    split = load_split(state_dir() / "work" / "dagtest-c" / "split-cassandra.npz")
    # train rows: class 0 has 6 + the 8 planted images, classes 1 and 2 have 6; 8:2 cuts are [11,3], [5,1], [5,1]
    assert [len(p) for p in split.parts] == [21, 5]
    assert split.source["metadata_table"] == "imgest_dag_test.metadata"
    with open(state_dir() / "work" / "dagtest-c" / "split-cassandra.pckl", "rb") as fh:
        assert pickle.load(fh)["num_classes"] == 3


def test_files_target_with_read_back_and_xnvme(
    airflow_home: AirflowServer, source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files target, its job through spark-submit as a deployment runs it (not the suite's reused driver; the
    Cassandra and shard targets go through spark-submit in tests/dags/test_hosts.py)."""
    dest = tmp_path / "files"
    conf = {"target": "files", "source": str(source), "dataset": "dagtest-f", "files_dest": str(dest)}
    monkeypatch.delenv("IMGEST_SPARK_DRIVER_SOCKET", raising=False)
    proc = airflow_home.airflow("dags", "test", "ingest_imagenet", "--conf", json.dumps(conf), check=False)
    out = (proc.stdout or "") + (proc.stderr or "")
    assert proc.returncode == 0, out[-3000:]
    assert "Spark-Submit cmd" in out  # the provider's hook ran spark-submit
    assert "reused Spark driver" not in out
    states = _states(airflow_home)
    for task in ("ingest_files", "verify_files", "build_split", "read_throughput", "validate_xnvme", "publish_asset"):
        assert states[task] == "success", (task, states)
    manifest = json.loads((dest / "manifest.json").read_text())
    assert sum(manifest["samples"].values()) == 18 + 6 + 8
    assert manifest["root"].startswith("v/")  # the version folder the manifest names
    assert len(list((dest / manifest["root"]).glob("train/*/*.jpg"))) == 18 + 8
    gc = task_results(airflow_home, "ingest_imagenet", ("gc",))["gc"]
    assert states["gc"] == "success"
    assert (gc["current"], gc["kept"], gc["removed"]) == (manifest["root"], [manifest["root"]], [])  # one version
    work = state_dir() / "work" / "dagtest-f"
    xnvme = json.loads((work / "validate_xnvme.json").read_text())
    assert xnvme["ok"] is True
    assert {e["engine"] for e in xnvme["engines"]} >= {"dali_file", "python_file"}
    assert manifest["checks"]["read_throughput"] == str(work / "read_throughput.json")
    assert [len(p) for p in load_split(work / "split-files.npz").parts] == [21, 5]
    read = task_results(airflow_home, "ingest_imagenet", ("read_throughput",))["read_throughput"]
    assert read["run_seconds"] > 0  # the task measured the run before it from the DAG run's start
    spent = read["task_seconds_before"]  # the task's own run time before the check (its start-up, imports)
    assert 0 <= spent < 60
    # 10 % of the run with the check in it, less what the task already spent, <= 60 s
    assert read["budget_s"] == check_seconds(defaults.CHECK_SECONDS, read["run_seconds"], spent=spent)
    assert read["budget_cut"] == []  # 26 images: one batch of 64, the minimum, for each reader
    report = json.loads((work / "read_throughput.json").read_text())
    assert all(r["ok"] and r["images"] == r["images_verified"] == 18 + 8 for r in report["readers"])


def test_bad_conf_message_lists_every_problem() -> None:
    with pytest.raises(ConfigError) as err:
        validate_conf({"target": "shards", "crop": 300, "s3_dest": "http://x", "split_ratios": "8,-2", "colour": 1})
    assert "give a source" in str(err.value)
    message = str(err.value)
    for part in (
        "unknown setting 'colour'",
        "crop 300 must be between 1 and resize 256",
        "s3_dest 'http://x'",
        "split_ratios '8,-2'",
    ):
        assert part in message


def _run_count(airflow: AirflowServer) -> int:
    with sqlite3.connect(airflow.home / "airflow.db") as db:
        return db.execute("SELECT count(*) FROM dag_run WHERE dag_id = 'ingest_imagenet'").fetchone()[0]


def test_param_outside_its_schema_is_refused(airflow_home: AirflowServer) -> None:
    before = _run_count(airflow_home)
    ok, _, tail = run_dag(airflow_home, {"sample": True, "target": "hdfs"})
    assert not ok
    assert "ParamValidationError" in tail  # refused by the Param schema, not by the validate task
    assert "'hdfs' is not one of ['cassandra', 'shards', 'files']" in tail
    assert _run_count(airflow_home) == before  # no run was created, so no task ran


def test_no_source_is_never_the_sample() -> None:
    with pytest.raises(ConfigError, match="give a source"):
        validate_conf({"target": "cassandra"})
    assert validate_conf({"sample": True})["source"] is None


def test_asset_uri_comes_from_the_connection_address() -> None:
    uri = asset_uri({"sample": True, "keyspace": "inet", "table_suffix": "_orig"}, "10.1.2.3:9142")
    assert uri == "cassandra://10.1.2.3:9142/inet/data_orig"
    assert asset_uri({"sample": True, "target": "shards", "dataset": "x"}, "h:1") == "s3://imgest/x"
