"""The deployment on hosts that share nothing (`imgest services up hosts`): seven network namespaces on one bridge,
each with its own host name, /etc/hosts, empty state folder and /tmp. From inside a host 127.0.0.1 reaches none of
the stores and another host's disk is invisible; Airflow's processes hold the stores only as AIRFLOW_CONN_*
variables on the store host's address, and no S3 key at all: each host a web identity of its own (a token file and
its role, as IRSA gives pods) on the strict AWS. Then ingest_imagenet runs through the real scheduler (CeleryExecutor, a
Celery worker per host), its Spark job is submitted to the standalone master on its own host and its executors run
on spark-1 and spark-2: the Spark workers' own pages list the application's finished executors."""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import re
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
from tests.airflow_db import sql

pytestmark = [pytest.mark.services, pytest.mark.slow]
DEMO_STORED = 10 * (20 + 5) + 8  # DEMO_SAMPLE's train + val images and the eight awkward-but-valid planted ones
SOURCE_BUCKET = "imgest-src"
DATASETS_TOML = f"""[datasets.hr]
source = "s3://{SOURCE_BUCKET}/hs3/"
targets = ["shards"]
schedule = "0 0 29 2 *"
s3_dest = "s3://imgest/hr"
source_conn_id = "aws_default"
read_check = false
"""


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
    deployment.register_datasets(DATASETS_TOML)  # refresh_hr's entry, in each Airflow host's own config
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
    "loopback": {p: refused("127.0.0.1", p) for p in (9042, 5050, 5432, 6379, 7077, 8080)},
    "store": {p: refused("store", p) for p in (9042, 5050, 5432)},
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
            aws = json.loads(env["AIRFLOW_CONN_AWS_DEFAULT"])
            assert aws["extra"]["endpoint_url"] == f"http://{store}:5050"
            assert "login" not in aws
            assert "password" not in aws  # no key in the connection
            assert not [k for k in env if k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")]
            assert env["AWS_ROLE_ARN"].endswith(f":role/imgest-host-{host}")  # a web identity of its own
            assert Path(env["AWS_WEB_IDENTITY_TOKEN_FILE"]).is_relative_to(env["IMGEST_HOME"])  # on its own disk
            assert env["IMGEST_STATE_URL"] == STATE_URL
    cfg = (hosts.airflow().home / "airflow.cfg").read_text()
    assert f"execution_api_server_url = http://{hosts.address('control')}:8080/execution/" in cfg


# ------------------------------------------------------------------------------------------- DAG runs
def _sql(hosts: SimulatedHosts, query: str, *args: Any) -> list[tuple[Any, ...]]:
    return sql(hosts.airflow().postgres, query, *args)


def _trigger(hosts: SimulatedHosts, dag_id: str, conf: dict[str, Any], name: str) -> str:
    """Trigger DAG_ID with CONF inside the control host (the real scheduler, Celery workers); its run id."""
    deadline = time.monotonic() + 180
    while not _sql(hosts, "SELECT 1 FROM dag WHERE dag_id = %s", dag_id) and time.monotonic() < deadline:
        time.sleep(2)  # the DAG processor has not stored it yet
    run_id = f"hosts__{name}__{time.time_ns()}"
    hosts.airflow().airflow("dags", "trigger", dag_id, "--run-id", run_id, "--conf", json.dumps(conf))
    return run_id


def _wait(hosts: SimulatedHosts, run_ids: list[str], timeout: float = 720) -> dict[str, str]:
    """Each run's final state; a run still going at TIMEOUT (inside pytest's 900 s, with room for the test's checks)
    fails the test loudly, with every task's state and the end of each of the run's task logs."""
    deadline, states = time.monotonic() + timeout, dict.fromkeys(run_ids)
    while any(s not in ("success", "failed") for s in states.values()):
        if time.monotonic() > deadline:
            going = [r for r, s in states.items() if s not in ("success", "failed")]
            report = "\n".join(f"{r}: {_tasks(hosts, r)}\n{_log_tails(hosts, r)}" for r in going)
            pytest.fail(f"runs still going after {timeout:.0f} s: {states}\n{report}")
        for run_id in run_ids:
            rows = _sql(hosts, "SELECT state FROM dag_run WHERE run_id = %s", run_id)
            states[run_id] = rows[0][0] if rows else None
        time.sleep(5)
    return {r: str(s) for r, s in states.items()}


def _wait_quiet(hosts: SimulatedHosts, timeout: float = 240) -> None:
    """Until no DAG run of any DAG is queued or running (seen twice, 5 s apart: an asset event's run is created a
    moment after the publish that set it off); fails loudly with the runs still going at TIMEOUT."""
    deadline, quiet = time.monotonic() + timeout, 0
    while quiet < 2:
        going = _sql(hosts, "SELECT dag_id, run_id, state FROM dag_run WHERE state NOT IN ('success', 'failed')")
        quiet = 0 if going else quiet + 1
        if going and time.monotonic() > deadline:
            report = "\n".join(f"{r[1]}: {_tasks(hosts, r[1])}\n{_log_tails(hosts, r[1])}" for r in going)
            pytest.fail(f"runs still going after {timeout:.0f} s: {going}\n{report}")
        time.sleep(5)


def _log_tails(hosts: SimulatedHosts, run_id: str, lines: int = 15) -> str:
    """The last LINES lines of each task log of RUN_ID (any DAG), from the disk of the worker host that wrote it."""
    out = []
    for host in WORKER_HOSTS:
        for folder in (hosts.own(host) / "airflow" / "logs").glob(f"dag_id=*/run_id={run_id}"):
            for path in sorted(folder.rglob("*.log")):
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {host}: {path.relative_to(folder)}\n" + "\n".join(ln[:2000] for ln in tail))
    return "\n".join(out) or "(no task log written yet)"


def _tasks(hosts: SimulatedHosts, run_id: str) -> dict[str, tuple[Any, ...]]:
    """task id -> (state, host name, start, end) of RUN_ID's task instances."""
    query = "SELECT task_id, state, hostname, start_date, end_date FROM task_instance WHERE run_id = %s"
    return {r[0]: r[1:] for r in _sql(hosts, query, run_id)}


def _task_log(hosts: SimulatedHosts, run_id: str, task_id: str) -> str:
    """TASK_ID's logs in RUN_ID, from the disk of whichever worker host ran it."""
    logs = [hosts.own(h) / "airflow" / "logs" / "dag_id=ingest_imagenet" / f"run_id={run_id}" for h in WORKER_HOSTS]
    return "".join(
        p.read_text(errors="replace") for folder in logs for p in sorted(folder.glob(f"task_id={task_id}/*.log"))
    )


def _xcom(hosts: SimulatedHosts, run_id: str, task_id: str) -> Any:
    rows = _sql(
        hosts, "SELECT value FROM xcom WHERE run_id = %s AND task_id = %s AND key = 'return_value'", run_id, task_id
    )
    assert rows, f"no XCom of {task_id} in {run_id}"
    value = rows[0][0]
    return json.loads(value) if isinstance(value, str) else value


def _failed_logs(hosts: SimulatedHosts, run_id: str, dag_id: str = "ingest_imagenet") -> str:
    """The end of every failed or retried task's logs, read from the disk of the worker host that ran it."""
    out = []
    for host in WORKER_HOSTS:
        folder = hosts.own(host) / "airflow" / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
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


def _assert_ran_on_the_cluster(hosts: SimulatedHosts, before: set[str], jobs: int) -> None:
    """JOBS new applications completed on the standalone master, and each of them had executors on each Spark
    worker host (each worker's own page lists them)."""
    state_doc = hosts.spark_master().master_state() or {}
    addresses = {hosts.address(h) for h in SPARK_WORKER_HOSTS}
    assert {w["host"] for w in state_doc["workers"] if w["state"] == "ALIVE"} == addresses
    new = _completed_apps(hosts) - before
    assert len(new) == jobs, f"{len(new)} applications completed on the master, not {jobs}: {new}"
    for host in SPARK_WORKER_HOSTS:  # every new application, not just one of them, had executors there
        missing = new - _executor_apps(hosts, host)
        assert not missing, f"no executor of {sorted(missing)} ran on {host}"


def _shard_manifest(hosts: SimulatedHosts, dest: str) -> dict[str, Any]:
    bucket, _, prefix = dest.removeprefix("s3://").partition("/")
    client = hosts.aws().client("s3")
    return json.loads(client.get_object(Bucket=bucket, Key=f"{prefix}/manifest.json")["Body"].read())


def _shards_of(manifest: dict[str, Any]) -> list[tuple[str, int, str]]:
    return sorted((s["name"], s["samples"], s["sha256"]) for s in manifest["shards"])


def _one_machine_shards(dataset: str) -> list[tuple[str, int, str]]:
    """The shards of a one-machine run (this process's machine, a local Spark master, a folder destination) of
    DATASET over the same input the hosts read (DEMO_SAMPLE) with the same defaults and seed."""
    from imgest.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        write_sample(Path(tmp) / "src", DEMO_SAMPLE)
        out, work = Path(tmp) / "out", ["--work-dir", str(Path(tmp) / "work")]
        argv = ["ingest", "shards", str(Path(tmp) / "src"), "--dataset", dataset, "--dest", str(out), *work]
        assert main(argv) == 0
        return _shards_of(json.loads((out / "manifest.json").read_text()))


def _upload_source(hosts: SimulatedHosts, fresh: bool = False) -> None:
    """The demo sample on the store host's S3 (the source bucket), the source every host can read; FRESH: exactly
    the sample (what the refresh test changed, added and removed under hs3/ set back). Only the keys the sample
    lacks are deleted, and the rest overwritten: a folder that empties is SeaweedFS's to remove, asynchronously,
    and an object put into it meanwhile can go with it (seaweedfs/seaweedfs#10779), which once left the source
    one image short. The listing is then checked against the sample, key by key, size and MD5 (FRESH: and no other
    key)."""
    import hashlib

    from imgest.sources.s3objects import list_objects

    client = hosts.aws().client("s3")  # the deployer's; the bucket was made with the hosts' roles
    with tempfile.TemporaryDirectory() as tmp:
        write_sample(Path(tmp), DEMO_SAMPLE)
        files = {"hs3/" + p.relative_to(tmp).as_posix(): p for p in sorted(Path(tmp).rglob("*")) if p.is_file()}
        if fresh:
            for obj in list_objects(client, SOURCE_BUCKET, "hs3/"):
                if obj.key not in files:
                    client.delete_object(Bucket=SOURCE_BUCKET, Key=obj.key)
        for key, path in files.items():
            client.upload_file(str(path), SOURCE_BUCKET, key)
        want = {k: (p.stat().st_size, hashlib.md5(p.read_bytes()).hexdigest()) for k, p in files.items()}
    listed = {o.key: (o.size, o.etag) for o in list_objects(client, SOURCE_BUCKET, "hs3/")}
    keys = want.keys() | listed.keys() if fresh else want.keys()
    wrong = {k: (listed.get(k), want.get(k)) for k in keys if listed.get(k) != want.get(k)}
    assert not wrong, f"the source bucket does not hold the sample (key: (listed, written)): {wrong}"


def _assert_same_shards(hosts: SimulatedHosts, dest: str, dataset: str) -> None:
    """The shards at DEST are byte for byte those of a one-machine run of the same input (_one_machine_shards); where
    they are not, the message says what each run quarantined and each split's sample count."""
    manifest = _shard_manifest(hosts, dest)
    ours, one_machine = _shards_of(manifest), _one_machine_shards(dataset)
    if ours != one_machine:
        quarantine = [(q["path"], q["reason"]) for q in manifest.get("quarantine", {}).get("entries", [])]
        raise AssertionError(
            f"{dest}: shards {ours} != one machine's {one_machine}; samples {manifest.get('samples')}, "
            f"quarantined {quarantine}"
        )


def test_runs_together_through_the_scheduler(hosts: SimulatedHosts) -> None:
    """Triggered together, as users do: the generated sample into shards, an S3 source into Cassandra (bulk and
    cql-helper write paths: their helper installed with the environment, as in an image, and shipped to the executors)
    and into shards (twice: the second run waits for the first's lock), and the first version of refresh_hr (the
    datasets file's entry on that source). Each succeeds, tasks run on both Celery workers, one Spark job at a time
    (the spark pool), each through spark-submit to the master on its host with executors on spark-1 and spark-2;
    the stores hold what the sample holds, the shards byte for byte what a one-machine run of the same input packs."""
    _upload_source(hosts)
    before, t0 = _completed_apps(hosts), time.monotonic()
    source = {"source": f"s3://{SOURCE_BUCKET}/hs3/", "source_conn_id": "aws_default"}
    shards = {**source, "target": "shards", "dataset": "hs3", "s3_dest": "s3://imgest/hs3", "read_check": False}
    confs = {
        "hsample": {"sample": True, "target": "shards", "dataset": "hsample", "s3_dest": "s3://imgest/hsample"},
        "hs3c": {**source, "target": "cassandra", "dataset": "hs3c", "keyspace": "hs3c", "write_path": "bulk"},
        "hs3h": {**source, "target": "cassandra", "dataset": "hs3h", "keyspace": "hs3h", "write_path": "cql-helper"},
        "hs3": shards,
        "hs3-again": shards,
    }
    runs = {name: _trigger(hosts, "ingest_imagenet", conf, name) for name, conf in confs.items()}
    runs["hr"] = _trigger(hosts, "refresh_hr", {}, "hr")
    states = _wait(hosts, list(runs.values()))
    print(f"\n[hosts] six runs: {states} after {time.monotonic() - t0:.0f}s")
    tasks = {name: _tasks(hosts, run_id) for name, run_id in runs.items()}
    for name, run_id in runs.items():
        dag_id = "refresh_hr" if name == "hr" else "ingest_imagenet"
        assert states[run_id] == "success", f"{name}: {tasks[name]}\n{_failed_logs(hosts, run_id, dag_id)}"
    ran_on = {t[1] for done in tasks.values() for t in done.values() if t[0] == "success"}
    assert ran_on == set(WORKER_HOSTS)  # both workers ran tasks, each reading what the other wrote
    jobs = ("ingest_shards", "ingest_cassandra", "shards.ingest")
    spans = sorted((t[2], t[3]) for done in tasks.values() for j, t in done.items() if j in jobs and t[0] == "success")
    assert len(spans) == 6
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # one Spark job at a time: the spark pool
    # who took the lock first: whose lock task ended first (the other waited for its release); not whose started
    # first: both can start within milliseconds (8 ms in a CI run) and the later one win
    first, second = sorted(("hs3", "hs3-again"), key=lambda n: tasks[n]["lock"][3])
    assert f"is being written by Airflow DAG ingest_imagenet run {runs[first]}" in _task_log(
        hosts, runs[second], "lock"
    )
    for dest in ("s3://imgest/hsample", "s3://imgest/hs3", "s3://imgest/hr"):
        assert sum(_shard_manifest(hosts, dest)["samples"].values()) == DEMO_STORED
    checked = _shard_manifest(hosts, "s3://imgest/hsample")["checks"]["read_throughput"]
    assert checked == f"{STATE_URL}/work/hsample/read_throughput.json"  # where any host finds the report
    from imgest.core.settings import CassandraSettings
    from imgest.sinks.cassandra.client import cassandra_session

    with cassandra_session(CassandraSettings(hosts=(hosts.address("store"),))) as session:
        for ks in ("hs3c", "hs3h"):
            assert session.execute(f"SELECT count(*) FROM {ks}.data").one()[0] == DEMO_STORED, ks
            status = session.execute(f"SELECT status FROM {ks}.dataset_versions").one().status
            assert status == "complete", ks  # verify_cassandra read the S3 source through the run's connection
    # the bulk and cql-helper paths: the helper installed with the environment (imgest bulk-helper install, as in an
    # image's build) and shipped to executors on hosts whose disks
    # held none of them
    assert "write path: bulk" in _task_log(hosts, runs["hs3c"], "ingest_cassandra")
    assert "write path: cql-helper" in _task_log(hosts, runs["hs3h"], "ingest_cassandra")
    _assert_ran_on_the_cluster(hosts, before, jobs=10)  # six ingests, and the three shard runs' verify jobs
    _assert_same_shards(hosts, "s3://imgest/hs3", "hs3")
    from imgest.sources.s3objects import list_objects

    bucket, _, state = STATE_URL.removeprefix("s3://").partition("/")
    client = hosts.aws().client("s3")
    assert list(list_objects(client, bucket, f"{state}/staging/")) == []  # every run's staged files collected
    # every dataset lock let go, once the runs the five set off have ended too: check_datasets (asset-triggered by
    # each publish) takes a dataset's lock while it checks it, so hr's record came back a second after refresh_hr's
    # release_lock deleted it (the store's log: check_versions waiting, then holding it for 35 s)
    _wait_quiet(hosts)
    left = {o.key for o in list_objects(client, bucket, f"{state}/locks/")}
    assert left == set(), left


def test_refresh_of_a_changed_s3_source_through_the_scheduler(hosts: SimulatedHosts) -> None:
    """refresh_hr (the datasets file of each Airflow host) after one source image was rewritten, one added and
    one removed: the plan sees exactly that, the new version is published and the run's job ran on the cluster."""
    first = _shard_manifest(hosts, "s3://imgest/hr")  # the first version, test_runs_together_through_the_scheduler's
    client = hosts.aws().client("s3")
    listed = client.list_objects_v2(Bucket=SOURCE_BUCKET, Prefix="hs3/ILSVRC/Data/CLS-LOC/train/")["Contents"]
    jpegs = sorted(o["Key"] for o in listed if re.search(r"/(n\d{8})/\1_\d+\.JPEG$", o["Key"]))  # no planted file
    other = client.get_object(Bucket=SOURCE_BUCKET, Key=jpegs[1])["Body"].read()
    client.put_object(Bucket=SOURCE_BUCKET, Key=jpegs[0], Body=other)
    client.put_object(Bucket=SOURCE_BUCKET, Key=jpegs[0].rsplit("/", 1)[0] + "/added.JPEG", Body=other + b"\0")
    client.delete_object(Bucket=SOURCE_BUCKET, Key=jpegs[-1])
    before = _completed_apps(hosts)
    run_id = _trigger(hosts, "refresh_hr", {}, "refresh")
    state = _wait(hosts, [run_id])[run_id]
    assert state == "success", f"{_tasks(hosts, run_id)}\n{_failed_logs(hosts, run_id, 'refresh_hr')}"
    counts = _xcom(hosts, run_id, "shards.plan")["counts"]
    assert (counts["added"], counts["changed"], counts["removed"]) == (1, 1, 1), counts
    second = _shard_manifest(hosts, "s3://imgest/hr")
    assert second["key"] != first["key"]
    assert sum(second["samples"].values()) == DEMO_STORED  # one added, one removed
    _assert_ran_on_the_cluster(hosts, before, jobs=2)  # shards.ingest and shards.verify


def test_files_target_stops_in_validate_naming_the_shared_storage(hosts: SimulatedHosts) -> None:
    """The files target writes a folder every host must see; on hosts that share no disk validate refuses the run
    before any work, its error naming IMGEST_SHARED_MOUNTS."""
    conf = {"source": f"s3://{SOURCE_BUCKET}/hs3/", "target": "files", "dataset": "hfiles"}
    run_id = _trigger(hosts, "ingest_imagenet", conf, "files")
    assert _wait(hosts, [run_id], timeout=300)[run_id] == "failed"
    tasks = _tasks(hosts, run_id)
    assert tasks["validate"][0] == "failed"
    assert {t for t, (state, *_) in tasks.items() if state == "success"} == set()
    logs = _failed_logs(hosts, run_id)
    assert "the files target's folder" in logs
    assert "IMGEST_SHARED_MOUNTS" in logs


def test_cli_on_a_fresh_host_with_settings_from_variables(hosts: SimulatedHosts) -> None:
    """A person's shell on worker-a: no Airflow, nothing at 127.0.0.1, an empty disk, the stores named only by IMGEST_*
    variables and its web identity (no key). `imgest ingest cassandra` (IMGEST_CASSANDRA_HOSTS, no --hosts) and
    `imgest ingest shards` from the S3 source run on the cluster: the shards' run state goes beside their
    destination unasked, Cassandra's to the IMGEST_STATE_URL the person sets (the command says so when it is
    missing)."""
    env = hosts.base_env("worker-a") | {  # the host's web identity (AWS_ROLE_ARN, its token file), no key
        "IMGEST_CASSANDRA_HOSTS": hosts.address("store"),
        "IMGEST_S3_ENDPOINT": hosts.aws_endpoint,
    }
    assert "AWS_ACCESS_KEY_ID" not in env
    master = hosts.spark_master().master_url
    src = f"s3://{SOURCE_BUCKET}/hs3/"
    imgest = str(Path(sys.executable).parent / "imgest")
    cassandra = [imgest, "ingest", "cassandra", src, "--keyspace", "hcli", "--master", master, "--consistency", "ONE"]
    refused = hosts.run_in("worker-a", cassandra, env=env)
    assert refused.returncode == 1
    assert "IMGEST_STATE_URL=s3://bucket/prefix" in refused.stderr
    before = _completed_apps(hosts)
    done = hosts.run_in("worker-a", [*cassandra, "--verify"], env=env | {"IMGEST_STATE_URL": "s3://imgest/_cli"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    shards = [imgest, "ingest", "shards", src, "--dest", "s3://imgest/hcli", "--master", master]
    packed = hosts.run_in("worker-a", shards, env=env)
    assert packed.returncode == 0, packed.stdout[-3000:] + packed.stderr[-3000:]
    assert "run state: s3://imgest/_imgest-state" in packed.stdout
    assert sum(_shard_manifest(hosts, "s3://imgest/hcli")["samples"].values()) == DEMO_STORED
    _assert_ran_on_the_cluster(hosts, before, jobs=2)


def _java_on(hosts: SimulatedHosts, host: str) -> list[str]:
    """The java processes running on HOST now: its process table (every pid in its network namespace)."""
    done = subprocess.run(["ip", "netns", "pids", hosts.network.host(host).netns], capture_output=True, text=True)
    found = []
    for pid in done.stdout.split():
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "java":
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
    return found


def _rows(hosts: SimulatedHosts, keyspace: str) -> list[tuple[str, int, str, str]]:
    import hashlib

    from imgest.core.settings import CassandraSettings
    from imgest.sinks.cassandra.client import cassandra_session

    with cassandra_session(CassandraSettings(hosts=(hosts.address("store"),))) as session:
        data = {
            r.id: hashlib.sha256(r.data).hexdigest() for r in session.execute(f"SELECT id, data FROM {keyspace}.data")
        }
        meta = session.execute(f"SELECT id, label, split FROM {keyspace}.metadata")
        return sorted((str(r.id), r.label, r.split, data[r.id]) for r in meta)


def test_both_targets_through_spark_connect(hosts: SimulatedHosts) -> None:
    """spark_default switched to the Spark Connect server on the master's host (the Celery workers restarted with
    the new connection, as a deployment changes one): ingest_imagenet for both targets runs each job as the Connect
    session's thin client. No java process runs on either Airflow worker host at any moment of the runs (their
    process tables, sampled), the Connect server's executors ran on both Spark workers, the shards are byte for
    byte those of a one-machine spark-submit run of the same input and seed, and the Cassandra rows (CQL) those the
    spark-submit route's bulk load wrote from the same source (hs3c, earlier in this module)."""
    import dataclasses

    _upload_source(hosts, fresh=True)
    connect = dataclasses.replace(hosts, spark_route="connect")
    connect.restart_celery_workers()
    try:
        source = {"source": f"s3://{SOURCE_BUCKET}/hs3/", "source_conn_id": "aws_default", "read_check": False}
        confs = {
            # the datasets of the spark-submit runs above (ids derive from the dataset's name), other destinations
            "hcs": {**source, "target": "shards", "dataset": "hs3", "s3_dest": "s3://imgest/hcs"},
            "hcc": {**source, "target": "cassandra", "dataset": "hs3c", "keyspace": "hcc", "write_path": "cql"},
        }
        runs = {name: _trigger(hosts, "ingest_imagenet", conf, name) for name, conf in confs.items()}
        seen: dict[str, list[str]] = {h: [] for h in WORKER_HOSTS}
        states: dict[str, str] = {}
        while not states:
            for host in WORKER_HOSTS:
                seen[host] += _java_on(hosts, host)
            finished = {r: _sql(hosts, "SELECT state FROM dag_run WHERE run_id = %s", r) for r in runs.values()}
            if all(rows and rows[0][0] in ("success", "failed") for rows in finished.values()):
                states = {r: rows[0][0] for r, rows in finished.items()}
            time.sleep(0.5)
        for name, run_id in runs.items():
            assert states[run_id] == "success", f"{name}: {_tasks(hosts, run_id)}\n{_failed_logs(hosts, run_id)}"
        _wait_quiet(hosts)  # the check_datasets runs the publishes set off end on the Connect route too
    finally:
        hosts.restart_celery_workers()
    assert seen == {h: [] for h in WORKER_HOSTS}, seen  # no JVM on the Airflow workers
    assert "through Spark Connect at sc://" in _task_log(hosts, runs["hcs"], "ingest_shards")
    apps = (hosts.spark_master().master_state() or {}).get("activeapps", [])
    server = [a["id"] for a in apps if a["name"] == "Spark Connect server"]
    assert len(server) == 1, apps
    for host in SPARK_WORKER_HOSTS:
        assert server[0] in _executor_apps(hosts, host), f"no executor of the Connect server ran on {host}"
    _assert_same_shards(hosts, "s3://imgest/hcs", "hs3")
    connect_rows = _rows(hosts, "hcc")
    assert len(connect_rows) == DEMO_STORED
    assert connect_rows == _rows(hosts, "hs3c")
