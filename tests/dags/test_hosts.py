"""The deployment on hosts that share nothing (`imgest services up hosts`): seven network namespaces on one bridge,
each with its own host name, /etc/hosts, empty state folder and /tmp. From inside a host 127.0.0.1 reaches none of
the stores and another host's disk is invisible; Airflow's processes hold the stores only as AIRFLOW_CONN_*
variables on the store host's address. Then ingest_imagenet runs through the real scheduler (CeleryExecutor, a
Celery worker per host), its Spark job is submitted to the standalone master on its own host and its executors run
on spark-1 and spark-2: the Spark workers' own pages list the application's finished executors."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from imgest.services.hosts import SPARK_WORKER_HOSTS, STATE_URL, WORKER_HOSTS, SimulatedHosts
from imgest.sources.devdata.sample import DEMO_SAMPLE, write_sample

pytestmark = [pytest.mark.services, pytest.mark.slow]
DEMO_STORED = 10 * (20 + 5) + 8  # DEMO_SAMPLE's train + val images and the eight awkward-but-valid planted ones
SOURCE_BUCKET = "imgest-src"


@pytest.fixture(scope="module")
def hosts() -> Iterator[SimulatedHosts]:
    """The deployment, on empty disks; stopped (namespaces deleted) at the module's end unless it was running."""
    if os.geteuid() != 0:
        pytest.skip("hosts need root: network namespaces, a bridge, mounts")
    deployment = SimulatedHosts.default()
    if deployment.answers():
        yield deployment
        return
    deployment.wipe()
    try:
        print(f"\n[fixture] {deployment.up().message}")
        yield deployment
    finally:
        deployment.down()


PROBE = """
import json, os, socket, sys
def refused(host, port):
    with socket.socket() as s:
        s.settimeout(3)
        return s.connect_ex((host, port))
marker, others = sys.argv[1], sys.argv[2:]
print(json.dumps({
    "hostname": socket.gethostname(),
    "loopback": {p: refused("127.0.0.1", p) for p in (9042, 8333, 5432, 6379, 7077, 8080)},
    "store": {p: refused("store", p) for p in (9042, 8333, 5432)},
    "marker": os.path.exists(os.path.join(os.environ["IMGEST_HOME"], marker)),
    "home": sorted(os.listdir(os.environ["IMGEST_HOME"])),
    "others": [p for p in others if os.path.exists(p)],
    "tmp": sorted(os.listdir("/tmp")),
}))
"""


def _probe(hosts: SimulatedHosts, host: str, marker: str) -> dict[str, Any]:
    others = [str(hosts.own(h.name)) for h in hosts.network.hosts if h.name != host]
    done = hosts.run_in(host, [sys.executable, "-c", PROBE, marker, *others], timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_hosts_share_nothing(hosts: SimulatedHosts) -> None:
    marker = f"marker-{secrets.token_hex(4)}"
    wrote = hosts.run_in("worker-b", ["sh", "-c", f'echo b > "$IMGEST_HOME/{marker}" && touch /tmp/{marker}'])
    assert wrote.returncode == 0, wrote.stderr
    assert (hosts.own("worker-b") / marker).is_file()  # on worker-b's own disk (root view)
    seen = _probe(hosts, "worker-a", marker)
    assert seen["hostname"] == "worker-a"
    assert set(seen["loopback"].values()) == {errno.ECONNREFUSED}, seen["loopback"]  # 127.0.0.1 is nobody
    assert set(seen["store"].values()) == {0}, seen["store"]  # the store answers at its own address
    assert not seen["marker"]  # worker-b's disk is not worker-a's
    assert marker not in seen["tmp"]  # nor its /tmp
    assert seen["others"] == []  # no other host's folder, at any path
    assert "cassandra-lib" not in seen["home"]  # nor the root machine's state
    names = {h.name: hosts.run_in(h.name, ["hostname"]).stdout.strip() for h in hosts.network.hosts}
    assert names == {h.name: h.name for h in hosts.network.hosts}


def _environments(hosts: SimulatedHosts, host: str) -> list[dict[str, str]]:
    """The environments of the Airflow processes in HOST's namespace (those whose title did not overwrite it)."""
    done = subprocess.run(["ip", "netns", "pids", hosts.network.host(host).netns], capture_output=True, text=True)
    envs = []
    for pid in done.stdout.split():
        with contextlib.suppress(OSError):
            items = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
            env = dict(item.split("=", 1) for item in items if "=" in item)
            if "AIRFLOW_HOME" in env:
                envs.append(env)
    return envs


def test_airflow_holds_the_stores_as_connections_only(hosts: SimulatedHosts) -> None:
    store = hosts.address("store")
    for host in ("control", *WORKER_HOSTS):
        envs = _environments(hosts, host)
        assert envs, f"no Airflow process with a readable environment on {host}"
        for env in envs:
            assert not [k for k, v in env.items() if "127.0.0.1" in v or "localhost" in v], env
            assert "IMGEST_SPARK_DRIVER_SOCKET" not in env
            assert "IMGEST_CASSANDRA_HOSTS" not in env
            assert json.loads(env["AIRFLOW_CONN_CASSANDRA_DEFAULT"])["host"] == store
            assert json.loads(env["AIRFLOW_CONN_AWS_DEFAULT"])["extra"]["endpoint_url"] == f"http://{store}:8333"
            assert env["IMGEST_STATE_URL"] == STATE_URL
    cfg = (hosts.airflow().home / "airflow.cfg").read_text()
    assert f"execution_api_server_url = http://{hosts.address('control')}:8080/execution/" in cfg


# ------------------------------------------------------------------------------------------- DAG runs
def _sql(hosts: SimulatedHosts, query: str, *args: Any) -> list[tuple[Any, ...]]:
    import psycopg2

    pg = hosts.airflow().postgres
    conn = psycopg2.connect(host=pg.host, port=pg.port, user="airflow", password=pg.password, dbname="airflow")
    try:
        with conn.cursor() as cur:
            cur.execute(query, args)
            return list(cur.fetchall())
    finally:
        conn.close()


def _run(hosts: SimulatedHosts, conf: dict[str, Any], timeout: float = 900) -> tuple[str, str | None]:
    """Trigger ingest_imagenet with CONF inside the control host; (run id, final state)."""
    deadline = time.monotonic() + 180
    while not _sql(hosts, "SELECT 1 FROM dag WHERE dag_id = 'ingest_imagenet'") and time.monotonic() < deadline:
        time.sleep(2)  # the DAG processor has not stored it yet
    run_id = f"hosts__{conf['dataset']}__{time.time_ns()}"
    hosts.airflow().airflow("dags", "trigger", "ingest_imagenet", "--run-id", run_id, "--conf", json.dumps(conf))
    deadline = time.monotonic() + timeout
    state = None
    while time.monotonic() < deadline:
        rows = _sql(hosts, "SELECT state FROM dag_run WHERE run_id = %s", run_id)
        state = rows[0][0] if rows else None
        if state in ("success", "failed"):
            break
        time.sleep(5)
    return run_id, state


def _tasks(hosts: SimulatedHosts, run_id: str) -> dict[str, tuple[str, str]]:
    rows = _sql(hosts, "SELECT task_id, state, hostname FROM task_instance WHERE run_id = %s", run_id)
    return {r[0]: (r[1], r[2]) for r in rows}


def _failed_logs(hosts: SimulatedHosts, run_id: str) -> str:
    """The end of every failed or retried task's logs, read from the disk of the worker host that ran it."""
    out = []
    for host in WORKER_HOSTS:
        folder = hosts.own(host) / "airflow" / "logs" / "dag_id=ingest_imagenet" / f"run_id={run_id}"
        for path in sorted(folder.rglob("*.log")):
            lines = [ln for ln in path.read_text(errors="replace").splitlines() if '"level":"error"' in ln]
            if lines:
                out.append(f"--- {host}: {path.relative_to(folder)}\n" + "\n".join(ln[:3000] for ln in lines[-3:]))
    return "\n".join(out)


def _completed_apps(hosts: SimulatedHosts) -> set[str]:
    state = hosts.spark_master().master_state()
    assert state is not None, "the Spark master does not answer"
    return {app["id"] for app in state["completedapps"]}


def _executor_apps(hosts: SimulatedHosts, host: str) -> set[str]:
    """Applications whose executors ran on the Spark worker of HOST, from that worker's own page."""
    with urllib.request.urlopen(f"{hosts.spark_worker(host).ui}/json/", timeout=10) as resp:
        doc = json.loads(resp.read())
    return {e["appid"] for e in doc["finishedexecutors"]} | {e["appid"] for e in doc["executors"]}


def _ingest(hosts: SimulatedHosts, conf: dict[str, Any]) -> None:
    """Run CONF through the scheduler; assert the shards, the workers that ran it and where the executors ran."""
    before = _completed_apps(hosts)
    t0 = time.monotonic()
    run_id, state = _run(hosts, conf)
    print(f"\n[hosts] {conf['dataset']}: run {run_id} {state} after {time.monotonic() - t0:.0f}s")
    tasks = _tasks(hosts, run_id)
    assert state == "success", f"{tasks}\n{_failed_logs(hosts, run_id)}"
    assert {host for s, host in tasks.values() if s == "success"} <= set(WORKER_HOSTS)
    client = hosts.s3().settings().client()
    key = conf["s3_dest"].removeprefix("s3://imgest/") + "/manifest.json"
    doc = json.loads(client.get_object(Bucket="imgest", Key=key)["Body"].read())
    assert sum(doc["samples"].values()) == DEMO_STORED
    state_doc = hosts.spark_master().master_state() or {}
    addresses = {hosts.address(h) for h in SPARK_WORKER_HOSTS}
    assert {w["host"] for w in state_doc["workers"] if w["state"] == "ALIVE"} == addresses
    new = _completed_apps(hosts) - before
    assert new, "no Spark application completed on the standalone master"
    for host in SPARK_WORKER_HOSTS:  # each worker's own page: executors of the run's application ran there
        assert _executor_apps(hosts, host) & new, f"no executor of {new} ran on {host}"


def test_ingest_generated_sample_through_the_scheduler(hosts: SimulatedHosts) -> None:
    _ingest(hosts, {"sample": True, "target": "shards", "dataset": "hsample", "s3_dest": "s3://imgest/hsample"})


def test_ingest_s3_source_through_the_scheduler(hosts: SimulatedHosts) -> None:
    """The same sample from the store host's S3, the source every host can read."""
    client = hosts.s3().settings().client()
    if SOURCE_BUCKET not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket=SOURCE_BUCKET)
    with tempfile.TemporaryDirectory() as tmp:
        write_sample(Path(tmp), DEMO_SAMPLE)
        for path in sorted(Path(tmp).rglob("*")):
            if path.is_file():
                client.upload_file(str(path), SOURCE_BUCKET, "hs3/" + path.relative_to(tmp).as_posix())
    conf = {"source": f"s3://{SOURCE_BUCKET}/hs3/", "source_conn_id": "aws_default", "target": "shards"}
    _ingest(hosts, {**conf, "dataset": "hs3", "s3_dest": "s3://imgest/hs3"})
