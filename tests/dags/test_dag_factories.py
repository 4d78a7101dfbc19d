"""DAG factories (#67): DAGs built with a platform's own DAG ids and connection ids, side by side.

`imgest dags install --dag-id` writes a file that builds the ingest DAG through imgest.operators.ingest_dag; two
such DAGs, each with connection ids of its own, run through `airflow dags test` while the *_default connections
point nowhere: every store, source and Spark master is reached through the DAG's own ids. The runs keep their state
where the `[imgest]` section of Airflow's configuration says (`AIRFLOW__IMGEST__STATE_URL`, no IMGEST_STATE_URL).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from imgest.cli.dags import install
from imgest.core.settings import CassandraSettings
from imgest.operators.config_options import OPTIONS
from imgest.services import AirflowServer, CassandraServer, S3Server
from imgest.services.demo import task_durations
from imgest.sinks.cassandra.client import cassandra_session

DEMO_STORED = 10 * (20 + 5) + 8  # the generated sample's train + val images and its eight awkward-but-valid ones
KINDS = ("cassandra", "aws", "spark")
NOWHERE = {
    "cassandra_default": {"conn_type": "cassandra", "host": "127.0.0.1", "port": 9},
    "aws_default": {
        "conn_type": "aws",
        "login": "nobody",
        "password": "nothing",
        "extra": {"endpoint_url": "http://127.0.0.1:9", "region_name": "us-east-1"},
    },
    "spark_default": {"conn_type": "spark", "host": "spark://127.0.0.1:9"},
}


def _team_connections(real: dict[str, dict[str, Any]], team: str) -> dict[str, str]:
    """The team's connection ids (its copies of the working connections) and their AIRFLOW_CONN_* values."""
    return {f"AIRFLOW_CONN_{team.upper()}_{kind.upper()}": json.dumps(real[f"{kind}_default"]) for kind in KINDS}


def _dag_file(folder: Path, team: str) -> Path:
    ids = {kind: f"{team}_{kind}" for kind in KINDS} | {"source": f"{team}_aws"}
    (path,) = install(folder, dag_id=f"ingest_{team}", connections=ids, spark_pool="spark")
    return path


def _events(airflow: AirflowServer, dag_id: str) -> list[dict[str, Any]]:
    """The extras of the asset events DAG_ID's runs emitted."""
    query = "SELECT e.extra FROM asset_event e WHERE e.source_dag_id = ? ORDER BY e.id"
    with sqlite3.connect(airflow.home / "airflow.db") as db:
        return [json.loads(r[0]) for r in db.execute(query, (dag_id,)).fetchall()]


@pytest.mark.services
@pytest.mark.slow
def test_two_factory_dags_run_side_by_side_through_their_own_connections(
    airflow_home: AirflowServer,
    cassandra_server: CassandraServer,
    s3_server: S3Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = airflow_home.connections(cassandra_server, s3_server)
    for team in ("team_a", "team_b"):
        for name, value in _team_connections(real, team).items():
            monkeypatch.setenv(name, value)
    for conn_id, value in NOWHERE.items():  # the defaults reach nothing: a DAG that read them would fail
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(value))
    folder = tmp_path / "dags"
    files = {team: _dag_file(folder, team) for team in ("team_a", "team_b")}
    monkeypatch.setenv("AIRFLOW__CORE__DAGS_FOLDER", str(folder))  # `dags test -f` takes a file of the DAG folder
    monkeypatch.delenv("IMGEST_STATE_URL", raising=False)
    state = f"factory-state-{tmp_path.name[-12:].replace('_', '-')}"
    monkeypatch.setenv("AIRFLOW__IMGEST__STATE_URL", f"s3://imgest/{state}")  # only in Airflow's configuration
    with cassandra_session(
        CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)
    ) as session:
        session.execute("DROP KEYSPACE IF EXISTS team_b", timeout=60)
    confs = {
        "team_a": {"sample": True, "target": "shards", "dataset": "team-a", "s3_dest": "s3://imgest/team-a"},
        "team_b": {"sample": True, "target": "cassandra", "dataset": "team-b", "keyspace": "team_b"},
    }
    listed = airflow_home.airflow("config", "list", "--section", "imgest", "--include-descriptions").stdout
    assert "[imgest]" in listed  # `airflow config list` shows the section, each option described
    assert all(f"{name} =" in listed for name in OPTIONS)
    assert "Where runs keep their state" in listed
    got = airflow_home.airflow("config", "get-value", "imgest", "state_url").stdout.strip().splitlines()[-1]
    assert got == f"s3://imgest/{state}"
    for team, conf in confs.items():
        conf["read_check"] = False
        args = ("dags", "test", f"ingest_{team}", "-f", str(files[team]), "--conf", json.dumps(conf))
        proc = airflow_home.airflow(*args, check=False)
        out = (proc.stdout or "") + (proc.stderr or "")
        assert proc.returncode == 0, out[-4000:]
        states = {task: state for task, state, _ in task_durations(airflow_home, f"ingest_{team}")}
        target = conf["target"]
        for task in ("validate", "scan", f"ingest_{target}", f"verify_{target}", "build_split", "publish_asset"):
            assert states[task] == "success", (team, task, states)
    client = s3_server.settings().client()
    doc = json.loads(client.get_object(Bucket="imgest", Key="team-a/manifest.json")["Body"].read())
    assert sum(doc["samples"].values()) == DEMO_STORED
    with cassandra_session(
        CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)
    ) as session:
        assert session.execute("SELECT count(*) FROM team_b.data").one()[0] == DEMO_STORED
    work = {o["Key"] for o in client.list_objects_v2(Bucket="imgest", Prefix=f"{state}/work/")["Contents"]}
    for dataset in ("team-a", "team-b"):  # each run's work folder went where [imgest] state_url says
        assert f"{state}/work/{dataset}/manifest.parquet" in work, sorted(work)[:20]
    for team in ("team_a", "team_b"):  # what check_datasets reads each version back through
        event = _events(airflow_home, f"ingest_{team}")[-1]  # this run's (the home outlives a test)
        expected = {kind: f"{team}_{kind}" for kind in KINDS} | {"source": f"{team}_aws"}
        assert event["connections"] == expected


def test_the_factory_hands_each_operator_the_dag_s_connection_ids_and_pool() -> None:
    from imgest.operators.dag_connections import DagConnections
    from imgest.operators.ingest_dag import ingest_imagenet_dag

    conns = DagConnections(cassandra="c_b", aws="s3_b", source="src_b", spark="spark_b")
    dag = ingest_imagenet_dag("ingest_b", connections=conns, spark_pool="pool_b", tags=("team-b",))
    default = ingest_imagenet_dag()
    assert (dag.dag_id, default.dag_id, dag.tags) == ("ingest_b", "ingest_imagenet", {"team-b"})
    assert {t.task_id for t in dag.tasks} == {t.task_id for t in default.tasks}
    tasks = {t.task_id: t for t in dag.tasks}
    for spark_job in ("ingest_cassandra", "ingest_shards", "ingest_files"):
        job = tasks[spark_job]
        assert (job._conn_id, job.state_conn_id, job.pool) == ("spark_b", "s3_b", "pool_b"), spark_job
    for task in tasks.values():  # no operator of the DAG keeps a default id
        assert getattr(task, "aws_conn_id", "s3_b") == "s3_b", task.task_id
        assert getattr(task, "cassandra_conn_id", "c_b") == "c_b", task.task_id
    assert tasks["ingest_cassandra"].cassandra_conn_id == "c_b"
    assert tasks["lock"].aws_conn_id == tasks["release_lock"].aws_conn_id == "s3_b"
    for task in tasks.values():  # every operator that holds the run's lease reaches its stores through the DAG's ids
        if type(task).__module__.startswith("imgest.operators"):
            assert getattr(task, "cassandra_conn_id", None) in (None, "c_b"), task.task_id
    assert tasks["gc"].cassandra_conn_id == tasks["verify_cassandra"].cassandra_conn_id == "c_b"
    assert dag.params["source_conn_id"] == "src_b"  # an s3:// source without a connection of its own
    assert DagConnections.from_extra({"connections": conns.to_extra()}) == conns
    assert DagConnections.from_extra({}) == DagConnections()  # an event from before connections were recorded


def test_airflow_config_lists_the_imgest_section_and_a_task_takes_its_values(monkeypatch: pytest.MonkeyPatch) -> None:
    from imgest.operators.config_options import export_section
    from imgest.operators.provider_info import get_provider_info

    section = get_provider_info()["config"]["imgest"]["options"]
    assert set(section) == set(OPTIONS)
    environ = {"IMGEST_LOCK_WAIT_S": "5"}
    monkeypatch.setenv("AIRFLOW__IMGEST__STATE_URL", "s3://b/p")
    monkeypatch.setenv("AIRFLOW__IMGEST__LOCK_WAIT_S", "3600")
    assert export_section(environ) == {"IMGEST_STATE_URL": "s3://b/p"}  # the variable, where set, wins
    assert environ == {"IMGEST_LOCK_WAIT_S": "5", "IMGEST_STATE_URL": "s3://b/p"}


def test_dags_install_writes_a_file_building_the_dag_with_its_ids(tmp_path: Path) -> None:
    import runpy

    (path,) = install(tmp_path, dag_id="ingest_c", connections={"cassandra": "c_c"}, spark_pool="p")
    assert path.name == "imgest_ingest_c.py"
    dag = runpy.run_path(str(path))["dag"]
    assert dag.dag_id == "ingest_c"
    assert dag.fileloc == str(path)  # the worker parses this file to run its tasks, not the factory's module
    from airflow.utils.file import might_contain_dag

    assert might_contain_dag(str(path), safe_mode=True)  # Airflow's DAG processor does not skip it
    assert {t.task_id: t for t in dag.tasks}["verify_cassandra"].cassandra_conn_id == "c_c"
    assert {t.task_id: t for t in dag.tasks}["verify_shards"].aws_conn_id == "aws_default"  # not given: default
