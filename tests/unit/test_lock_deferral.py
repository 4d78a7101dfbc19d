"""The dataset lock's wait, deferred: the lock task finds the lock held, defers to the triggerer with a
DatasetLockTrigger (its worker slot free), the trigger fires once the holder lets go (or at the wait's deadline,
naming the holder), and the task, back, takes the lock, or defers again when another writer was quicker. Against a
real folder store; the deployment's scheduler, triggerer and Celery worker: tests/dags/test_celery_deployment.py."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import airflow.sdk as airflow_sdk
import pytest

from imgest.core import locks
from imgest.core.lock_stores import FileLockStore
from imgest.operators.dataset_lock import DatasetLockOperator
from imgest.operators.lock_trigger import BUSY, FREE, DatasetLockTrigger

try:
    from airflow.sdk.exceptions import TaskDeferred
except ImportError:  # Airflow 3.1
    from airflow.exceptions import TaskDeferred

CLI = locks.Holder("cli", "pid 4242 on elsewhere: imgest ingest shards", 4242, "elsewhere", "2026-12-06T06:00:00Z", 600)
CONTEXT = {"run_id": "manual__r1"}


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FileLockStore:
    """The run's lock store (what $IMGEST_LOCK_URL names for the task), holding CLI's lock of 'ds'."""
    monkeypatch.setenv("IMGEST_LOCK_URL", str(tmp_path / "locks"))
    found = FileLockStore(tmp_path / "locks")
    assert locks.try_acquire("ds", CLI, found) is None
    return found


def _task(**kw: Any) -> DatasetLockOperator:
    with airflow_sdk.DAG("ingest_imagenet", schedule=None):
        return DatasetLockOperator(task_id="lock", dataset="ds", poll=0.1, **kw)


def _deferred(op: DatasetLockOperator, call: Any, *args: Any, **kw: Any) -> TaskDeferred:
    with pytest.raises(TaskDeferred) as deferred:
        call(*args, **kw)
    return deferred.value


def _fire(trigger: Any, meanwhile: Any = None) -> tuple[dict[str, Any], float]:
    """The first event of TRIGGER (as Airflow gets it from a serialized copy) and the seconds it took; MEANWHILE
    runs in a thread 0.5 s after the trigger starts."""
    path, kwargs = trigger.serialize()
    assert path == "imgest.operators.lock_trigger.DatasetLockTrigger"
    copy = DatasetLockTrigger(**kwargs)

    async def first() -> Any:
        async for event in copy.run():
            return event

    if meanwhile:
        threading.Timer(0.5, meanwhile).start()
    started = time.monotonic()
    event = asyncio.run(first())
    return event.payload, time.monotonic() - started


def test_a_held_lock_defers_the_task_and_it_takes_the_lock_when_freed(store: FileLockStore) -> None:
    op = _task(wait=60)
    deferred = _deferred(op, op.execute, CONTEXT)
    assert deferred.method_name == "resume_after_wait"
    assert deferred.timeout is not None
    assert deferred.timeout.total_seconds() > 60
    assert deferred.trigger.location == store.location
    assert locks.current("ds", store) == CLI  # the task took nothing while it waits
    event, took = _fire(deferred.trigger, lambda: locks.release("ds", CLI, store))
    assert event == {"status": FREE}
    assert took >= 0.5  # it fired when the holder let go, not before
    assert "holds ds" in op.resume_after_wait(CONTEXT, event, **deferred.kwargs)
    held = locks.current("ds", store)
    assert held is not None
    assert held.who == locks.airflow_holder("ingest_imagenet", "manual__r1").who


def test_the_wait_runs_out_naming_the_holder(store: FileLockStore) -> None:
    op = _task(wait=1)
    deferred = _deferred(op, op.execute, CONTEXT)
    event, took = _fire(deferred.trigger)
    assert event["status"] == BUSY
    assert event["who"] == CLI.who
    assert took >= 0.9  # at the deadline, not before
    with pytest.raises(locks.DatasetBusyError) as busy:
        op.resume_after_wait(CONTEXT, event, **deferred.kwargs)
    text = str(busy.value)
    assert f"is being written by {CLI.who} (since {CLI.since}) after waiting 1s" in text
    assert f"imgest locks release ds (lock store {store.location})" in text
    assert locks.current("ds", store) == CLI


def test_another_writer_quicker_than_the_task_defers_it_again(store: FileLockStore) -> None:
    op = _task(wait=60)
    deferred = _deferred(op, op.execute, CONTEXT)
    other = locks.airflow_holder("refresh_ds", "scheduled__2")
    locks.release("ds", CLI, store)
    assert locks.try_acquire("ds", other, store) is None  # between the trigger's event and the task's return
    again = _deferred(op, op.resume_after_wait, CONTEXT, {"status": FREE}, **deferred.kwargs)
    assert again.kwargs["deadline"] == deferred.kwargs["deadline"]  # the same wait, not a new one


def test_free_own_or_stale_locks_never_defer(store: FileLockStore) -> None:
    mine = locks.airflow_holder("ingest_imagenet", "manual__r1")
    locks.release("ds", CLI, store)
    assert locks.try_acquire("ds", mine, store) is None  # a retried lock task: the run holds it already
    assert "holds ds" in _task(wait=60).execute(CONTEXT)
    locks.release("ds", mine, store)
    gone = locks.Holder("cli", "pid 1 on elsewhere: imgest ingest", 1, "elsewhere", "2026-12-06T00:00:00Z", 0.5)
    assert locks.try_acquire("ds", gone, store) is None
    time.sleep(1.5)  # its lease runs out: the next writer takes it over
    trigger = DatasetLockTrigger("ds", "someone", store.location, time.time() + 60, 0.1)
    assert _fire(trigger)[0] == {"status": FREE}
    assert "holds ds" in _task(wait=60).execute(CONTEXT)


def test_without_deferral_the_worker_waits_as_before(store: FileLockStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IMGEST_LOCK_DEFERRABLE", "0")  # [imgest] lock_deferrable = 0: no triggerer
    threading.Timer(0.5, lambda: locks.release("ds", CLI, store)).start()
    started = time.monotonic()
    assert "holds ds" in _task(wait=30).execute(CONTEXT)  # no TaskDeferred: it waited here
    assert time.monotonic() - started >= 0.5
    with pytest.raises(locks.DatasetBusyError, match="is being written by Airflow DAG ingest_imagenet"):
        _task(wait=0, deferrable=True).execute({"run_id": "manual__r2"})  # no wait: fails at once, deferring nothing
