"""ingest_imagenet on Airflow as it is deployed (`imgest services up airflow-celery`): the real scheduler with
the CeleryExecutor, PostgreSQL, Redis, and two Celery workers that are hosts of their own (host names worker-a and
worker-b, each its own disk behind IMGEST_HOME, run state through IMGEST_STATE_URL): the faults. A worker killed
with SIGKILL while it runs ingest_cassandra (the task is retried on the other worker, counts exact), the scheduler
killed and restarted in the same run, PostgreSQL restarted between tasks. Runs triggered together (the spark pool,
the lock of a dataset written twice, tasks on both workers) are tests/dags/test_hosts.py's, on hosts that share
nothing."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from imgest.core.settings import CassandraSettings
from imgest.services import CassandraServer, S3Server
from imgest.services.airflow_celery import COMPONENTS, WORKERS, CeleryAirflow
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sources.devdata.sample import SampleSpec, write_sample
from tests.airflow_db import sql

pytestmark = [pytest.mark.services, pytest.mark.slow]
STORED = 3 * 6 + 3 * 2 + 8  # train + val + the eight awkward-but-valid planted images


@pytest.fixture(scope="module")
def celery(airflow_celery: CeleryAirflow) -> CeleryAirflow:
    """The deployment (tests/conftest.py), shared with the browser tests that run before these."""
    return airflow_celery


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local source outside every IMGEST_HOME (a volume both workers mount at the same path)."""
    root = tmp_path_factory.mktemp("celerysrc")
    write_sample(root, SampleSpec("cls-loc", classes=3, per_class=6, val_per_class=2, seed=31, defects=True))
    return root


@pytest.fixture(scope="module")
def big_source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A source whose ingest runs long enough to lose its worker in the middle: (path, images it stores)."""
    root = tmp_path_factory.mktemp("celerybig")
    spec = SampleSpec("cls-loc", classes=3, per_class=200, val_per_class=2, seed=32, defects=True)
    write_sample(root, spec)
    return root, spec.classes * (spec.per_class + spec.val_per_class) + 8


def _sql(celery: CeleryAirflow, query: str, *args: Any) -> list[tuple[Any, ...]]:
    return sql(celery.postgres, query, *args)


def _trigger(celery: CeleryAirflow, conf: dict[str, Any]) -> str:
    run_id = f"test__{conf['dataset']}__{time.time_ns()}"
    celery.airflow("dags", "trigger", "ingest_imagenet", "--run-id", run_id, "--conf", json.dumps(conf))
    return run_id


def _state(celery: CeleryAirflow, run_id: str) -> str | None:
    rows = _sql(celery, "SELECT state FROM dag_run WHERE run_id = %s", run_id)
    return rows[0][0] if rows else None


def _wait(
    celery: CeleryAirflow, run_ids: list[str], timeout: float = 900, supervise: bool = False
) -> dict[str, str | None]:
    """The runs' final states; SUPERVISE starts again any component that exited (an orchestrator's restart policy)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if supervise and any(celery.process_of(c).pid() is None for c in (*COMPONENTS, *WORKERS)):
            celery.up()
        states = {r: _state(celery, r) for r in run_ids}
        if all(s in ("success", "failed") for s in states.values()):
            return states
        time.sleep(5)
    return {r: _state(celery, r) for r in run_ids}


def _tasks(celery: CeleryAirflow, run_id: str) -> dict[str, tuple[Any, ...]]:
    rows = _sql(
        celery,
        "SELECT task_id, state, hostname, try_number, start_date, end_date FROM task_instance WHERE run_id = %s",
        run_id,
    )
    return {r[0]: r[1:] for r in rows}


def _stored(cassandra_server: CassandraServer, keyspace: str) -> int:
    with cassandra_session(
        CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)
    ) as session:
        return session.execute(f"SELECT count(*) FROM {keyspace}.data").one()[0]


def _running_on(celery: CeleryAirflow, run_id: str, task_id: str, timeout: float = 600) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        task = _tasks(celery, run_id).get(task_id)
        if task and task[0] == "running" and task[1]:
            return str(task[1])
        time.sleep(0.5)
    raise AssertionError(f"{task_id} never ran: {_tasks(celery, run_id)}")


def test_worker_lost_and_scheduler_restarted_during_ingest(
    celery: CeleryAirflow, cassandra_server: CassandraServer, big_source: tuple[Path, int]
) -> None:
    suffix = str(time.time_ns())[-6:]
    source, stored = big_source
    conf = {"source": str(source), "target": "cassandra", "dataset": f"celery-f{suffix}", "keyspace": f"fault_{suffix}"}
    conf["read_check"] = False
    run = _trigger(celery, conf)
    lost = _running_on(celery, run, "ingest_cassandra")
    time.sleep(5)  # the Spark job is under way
    worker = celery.process_of(lost)
    pid = worker.pid()
    assert pid is not None
    assert os.getpgid(pid) == pid  # the worker leads its own process group (started in a session of its own)
    os.killpg(pid, signal.SIGKILL)  # the host is gone: worker, task, Spark driver
    scheduler = celery.process_of("scheduler")
    scheduler_pid = scheduler.pid()
    assert scheduler_pid is not None
    os.killpg(scheduler_pid, signal.SIGKILL)  # and the scheduler dies too
    time.sleep(2)
    scheduler.start(celery.command("scheduler"), env=celery.env(), cwd=celery.home)
    try:
        states = _wait(celery, [run], timeout=900)
    finally:
        worker.start(celery.command(lost), env=celery.env(lost), cwd=celery.home)
    assert states[run] == "success", (states, _tasks(celery, run))
    ingest = _tasks(celery, run)["ingest_cassandra"]
    other = next(w for w in WORKERS if w != lost)
    assert ingest[1] == other  # retried on the worker that was left
    assert ingest[2] >= 2
    assert _stored(cassandra_server, conf["keyspace"]) == stored  # nothing lost, nothing duplicated


def _api(celery: CeleryAirflow, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """The REST API as the UI calls it (a token for the generated admin login)."""
    import urllib.request

    user, password = celery.login().split(" / ", 1)
    req = urllib.request.Request(
        f"{celery.url}/auth/token",
        data=json.dumps({"username": user, "password": password}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        token = json.load(resp)["access_token"]
    req = urllib.request.Request(
        f"{celery.url}{path}",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
        method=method,
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.load(resp)


def _published(s3_server: S3Server, dataset: str) -> tuple[list[tuple[str, str]], list[str]]:
    client = s3_server.settings().client()
    doc = json.loads(client.get_object(Bucket="imgest", Key=f"{dataset}/manifest.json")["Body"].read())
    listed = client.list_objects_v2(Bucket="imgest", Prefix=f"{dataset}/")
    return sorted((s["name"], s["sha256"]) for s in doc["shards"]), sorted(o["Key"] for o in listed["Contents"])


def test_postgres_restarted_between_tasks_and_a_task_cleared_from_the_ui(
    celery: CeleryAirflow, s3_server: S3Server, source: Path
) -> None:
    """The scheduler exits when its database goes away (Airflow's own behaviour); started again like a pod with a
    restart policy, it finishes the run. Clearing ingest_shards and what follows re-runs them to the same result."""
    suffix = str(time.time_ns())[-6:]
    conf = {"source": str(source), "target": "shards", "dataset": f"celery-p{suffix}", "read_check": False}
    run = _trigger(celery, conf)
    deadline = time.monotonic() + 300
    while (_tasks(celery, run).get("scan") or ("",))[0] != "success":
        assert time.monotonic() < deadline, _tasks(celery, run)
        time.sleep(0.5)
    celery.postgres.down()  # the metadata database goes away between tasks, and comes back
    time.sleep(3)
    celery.postgres.up()
    # what exits on the lost database (the scheduler, at its next query) starts again, as a restart policy does
    assert _wait(celery, [run], supervise=True)[run] == "success", _tasks(celery, run)
    before = _published(s3_server, conf["dataset"])
    assert len(before[0]) >= 2  # train and val shards

    cleared = _api(
        celery,
        "POST",
        "/api/v2/dags/ingest_imagenet/clearTaskInstances",
        {
            "dag_run_id": run,
            "task_ids": ["ingest_shards"],
            "include_downstream": True,
            "only_failed": False,  # the API's default clears failed tasks only; the UI's Clear sends False
            "reset_dag_runs": True,
            "dry_run": False,
        },
    )
    assert "ingest_shards" in {t["task_id"] for t in cleared["task_instances"]}
    time.sleep(2)
    assert _wait(celery, [run])[run] == "success", _tasks(celery, run)
    tasks = _tasks(celery, run)
    assert tasks["ingest_shards"][2] >= 2  # it ran again
    # Under the dataset's lock again: Clear takes the task's setup (lock) and teardown (release_lock) along.
    assert tasks["lock"][2] >= 2, tasks
    assert tasks["release_lock"][2] >= 2, tasks
    assert _published(s3_server, conf["dataset"]) == before  # idempotent: the same tars, nothing stray


def _lock_states(celery: CeleryAirflow, runs: list[str]) -> dict[str, str | None]:
    return {r: (_tasks(celery, r).get("lock") or (None,))[0] for r in runs}


def test_runs_waiting_on_locks_are_deferred_and_hold_no_worker_slot(
    celery: CeleryAirflow, s3_server: S3Server, source: Path
) -> None:
    """Four runs whose datasets another writer holds: each lock task defers to the triggerer (a DatasetLockTrigger
    it runs), so the four Celery slots (two workers x 2) stay free: a fifth run goes through all its tasks meanwhile.
    Let go, a waiting run takes the lock and publishes; the others are stopped from the API."""
    from imgest.core import locks
    from imgest.core.lock_stores import store_at

    store = store_at(celery.state_url(), s3_server.settings())  # the lock store the runs use (IMGEST_STATE_URL)
    holder = locks.cli_holder("imgest ingest shards (this test, holding)", lease_s=900)
    suffix = str(time.time_ns())[-6:]
    datasets = [f"celery-w{i}-{suffix}" for i in range(4)]
    for dataset in datasets:
        assert locks.try_acquire(dataset, holder, store) is None
    try:
        waiting = [_trigger(celery, {"source": str(source), "target": "shards", "dataset": d, "read_check": False})
                   for d in datasets]  # fmt: skip
        deadline = time.monotonic() + 300
        while set(_lock_states(celery, waiting).values()) != {"deferred"}:
            assert time.monotonic() < deadline, _lock_states(celery, waiting)
            time.sleep(1)
        triggers = _sql(
            celery,
            "SELECT t.classpath, t.kwargs FROM task_instance ti JOIN trigger t ON ti.trigger_id = t.id "
            "WHERE ti.task_id = 'lock' AND ti.run_id = ANY(%s)",
            waiting,
        )
        assert [t[0] for t in triggers] == ["imgest.operators.lock_trigger.DatasetLockTrigger"] * 4
        assert not _sql(celery, "SELECT task_id FROM task_instance WHERE run_id = ANY(%s) AND state = 'running'",
                        waiting)  # fmt: skip

        free = {"source": str(source), "target": "shards", "dataset": f"celery-free-{suffix}", "read_check": False}
        other = _trigger(celery, free)
        assert _wait(celery, [other], timeout=600)[other] == "success", _tasks(celery, other)
        assert set(_lock_states(celery, waiting).values()) == {"deferred"}  # still waiting, all along

        locks.release(datasets[0], holder, store)
        for run in waiting[1:]:  # stopped as a user would, from the UI's API
            _api(celery, "PATCH", f"/api/v2/dags/ingest_imagenet/dagRuns/{run}", {"state": "failed"})
        assert _wait(celery, [waiting[0]], timeout=600)[waiting[0]] == "success", _tasks(celery, waiting[0])
    finally:
        for dataset in datasets:
            locks.release(dataset, holder, store)
    assert _tasks(celery, waiting[0])["lock"][0] == "success"
    assert len(_published(s3_server, datasets[0])[0]) >= 2  # it wrote its shards once it had the lock
    assert locks.current(datasets[0], store) is None  # and gave the lock back
