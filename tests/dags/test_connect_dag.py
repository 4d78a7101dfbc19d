"""`airflow dags test ingest_imagenet` with `spark_default` a Spark Connect connection (the provider's
`spark_connect` type, `sc://host:15002`): both targets run through the Connect server on the standalone cluster,
the task runs each job as the session's thin client, and no `java` process starts below Airflow while they run
(read from the machine's process table: every JVM and its ancestors). The same jobs through Connect against
spark-submit's output: tests/jobs/test_spark_connect.py."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from imgest.core.paths import state_dir
from imgest.core.settings import CassandraSettings
from imgest.services import AirflowServer, CassandraServer, S3Server
from imgest.services.demo import run_dag, task_durations
from imgest.services.spark_cluster import SparkCluster
from imgest.services.spark_connect import SparkConnectServer
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sources.devdata.sample import SampleSpec, write_sample

pytestmark = [pytest.mark.services, pytest.mark.slow]
STORED = 3 * 4 + 3 * 2 + 8  # train + val + the eight awkward-but-valid planted images


class JavaWatch:
    """Every java process on the machine while the block runs, with its ancestors' command lines."""

    def __init__(self) -> None:
        self.seen: dict[int, list[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> JavaWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            for comm in Path("/proc").glob("[0-9]*/comm"):
                pid = int(comm.parent.name)
                try:
                    if pid not in self.seen and comm.read_text().strip() == "java":
                        self.seen[pid] = _ancestors(pid)
                except OSError:
                    continue

    def below(self, *words: str) -> dict[int, list[str]]:
        """The JVMs one of whose ancestors' command lines holds one of WORDS."""
        return {pid: chain for pid, chain in self.seen.items() if any(w in c for c in chain for w in words)}


def _ancestors(pid: int) -> list[str]:
    chain = []
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
            chain.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except (OSError, ValueError):
            break
    return chain


def _apps(cluster: SparkCluster) -> dict[str, str]:
    """id -> name of every application the standalone master knows (running and finished)."""
    state = cluster.master_state() or {}
    return {a["id"]: a["name"] for a in [*state.get("activeapps", []), *state.get("completedapps", [])]}


@pytest.fixture
def on_connect(spark_connect: SparkConnectServer, monkeypatch: pytest.MonkeyPatch) -> SparkConnectServer:
    """spark_default (an environment connection) names the Connect server."""
    conn = {"conn_type": "spark_connect", "host": spark_connect.host, "port": spark_connect.port}
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(conn))
    return spark_connect


def test_both_targets_through_spark_connect_start_no_jvm_under_airflow(
    airflow_home: AirflowServer,
    on_connect: SparkConnectServer,
    cassandra_server: CassandraServer,
    s3_server: S3Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write_sample(
        tmp_path / "src", SampleSpec("cls-loc", classes=3, per_class=4, val_per_class=2, seed=43, defects=True)
    )
    ks = "imgest_dag_connect"
    settings = CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)
    with cassandra_session(settings) as session:
        session.execute(f"DROP KEYSPACE IF EXISTS {ks}", timeout=60)
    monkeypatch.setenv("IMGEST_STATE_URL", "local")  # the cluster's workers run here and see this disk
    monkeypatch.setenv("IMGEST_SHARED_MOUNTS", str(tmp_path))  # and the source's folder
    runs = {
        "shards": {"target": "shards", "source": str(tmp_path / "src"), "dataset": "dagconnect-s"},
        "cassandra": {
            "target": "cassandra",
            "source": str(tmp_path / "src"),
            "dataset": "dagconnect-c",
            "keyspace": ks,
        },
    }
    started, before = time.time(), _apps(on_connect.cluster)  # spark-submit's drivers register as imgest-<job>
    with JavaWatch() as watch:
        for target, conf in runs.items():
            ok, _, tail = run_dag(airflow_home, {**conf, "read_check": False})
            assert ok, tail
            states = {task: state for task, state, _ in task_durations(airflow_home, "ingest_imagenet")}
            assert states[f"ingest_{target}"] == "success", states
            assert states[f"verify_{target}"] == "success", states
    assert watch.seen, "the watch saw no JVM at all (the Connect server's executors are JVMs)"
    # nothing under `airflow dags test` (run as its own process, or by the suite's warm Airflow CLI) started one; the
    # test process's own children (the services it started) are not Airflow's
    airflow = (" dags test ", "imgest.services.airflow_cli")
    assert not watch.below(*airflow), watch.below(*airflow)
    with cassandra_session(settings) as session:
        assert session.execute(f"SELECT count(*) FROM {ks}.data").one()[0] == STORED
        assert session.execute(f"SELECT status FROM {ks}.dataset_versions").one().status == "complete"
    apps = _apps(on_connect.cluster)
    assert not [name for app, name in apps.items() if app not in before and name.startswith("imgest-")]  # no driver
    summary = state_dir() / "work" / "dagconnect-s" / "pack_shards.json"
    assert summary.stat().st_mtime > started  # the job's own summary, written by this run


def test_a_deferrable_job_lets_go_of_its_task_while_spark_runs_it(
    airflow_home: AirflowServer,
    on_connect: SparkConnectServer,
    s3_server: S3Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`[imgest] spark_deferrable = 1`: the shard job's client leaves its Spark call running on the server and exits,
    the task defers (`dags test` runs its trigger in line), and the client run again takes the partitions' results
    and publishes; the shards verify, and the run's results folder is gone."""
    write_sample(tmp_path / "src", SampleSpec("cls-loc", classes=3, per_class=4, val_per_class=2, seed=44))
    monkeypatch.setenv("IMGEST_STATE_URL", "local")  # the cluster's workers run here and see this disk
    monkeypatch.setenv("IMGEST_SHARED_MOUNTS", str(tmp_path))
    monkeypatch.setenv("IMGEST_SPARK_DEFERRABLE", "1")
    conf = {"target": "shards", "source": str(tmp_path / "src"), "dataset": "dagconnect-d", "read_check": False}
    proc = airflow_home.airflow("dags", "test", "ingest_imagenet", "--conf", json.dumps(conf), check=False)
    out = (proc.stdout or "") + (proc.stderr or "")
    assert proc.returncode == 0, out[-3000:]
    states = {task: state for task, state, _ in task_durations(airflow_home, "ingest_imagenet")}
    assert states["ingest_shards"] == states["verify_shards"] == "success", states
    assert "this client lets go of it" in out  # the client left its operation running and exited
    assert "deferred while operation" in out  # the task deferred to the operation's trigger
    assert "running trigger in line" in out
    assert "were kept by the detached run" in out  # the client run again asked Spark for nothing it had
    assert not list((state_dir() / "staging" / "connect").glob("*/*")), "a results folder was left behind"
