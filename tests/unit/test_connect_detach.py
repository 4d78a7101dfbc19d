"""The deferrable Connect job's parts that need no server: the results folder, the resume from kept results, the
trigger's reading of the server's errors and its events' handling by the operator (the whole route against a real
Connect server: tests/jobs/test_connect_detach.py)."""

from __future__ import annotations

import json
import logging
import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from imgest.operators.connect_job import check_event, run_key, spark_deferrable_default
from imgest.operators.connect_trigger import DONE, FAILED, GONE, LOST, SparkConnectOperationTrigger, classify
from imgest.spark import detach
from imgest.spark.detach import Results, ResultsLostError


def test_a_results_folder_keeps_whole_partitions_and_clears(tmp_path: Path) -> None:
    results = Results(f"{tmp_path / 'r'}/")
    assert results.have() == set()  # not even made yet
    results.put(3, b"three")
    results.put(0, b"zero")
    (tmp_path / "r" / ".part-000001.pkl.half").write_bytes(b"a write in flight")  # never counted
    assert results.have() == {0, 3}
    assert results.get(3) == b"three"
    results.put(3, b"again")  # a task attempt Spark ran twice: the last whole write stands
    assert results.get(3) == b"again"
    results.clear()
    assert not (tmp_path / "r").exists()


def test_a_call_whose_results_were_kept_does_not_run_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client run again after its operation ended: every partition's results kept, nothing asks Spark (None)."""
    monkeypatch.setenv("IMGEST_STATE_URL", "local")
    monkeypatch.setenv("IMGEST_HOME", str(tmp_path))
    monkeypatch.setattr(detach, "_calls", iter(range(7, 100)))
    monkeypatch.setattr(detach, "_clear_at_exit", lambda run: None)
    results = detach.run_results("r1", "07-pack-3")
    assert results.url.startswith(str(tmp_path))
    for index in range(3):
        results.put(index, pickle.dumps([f"shard-{index}-a", f"shard-{index}-b"]))
    out = detach.kept_call(None, 3, None, logging.getLogger("t"), "pack", "r1")
    assert out == ["shard-0-a", "shard-0-b", "shard-1-a", "shard-1-b", "shard-2-a", "shard-2-b"]  # index order


def test_results_missing_after_a_completed_operation_fail_naming_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Executors that wrote where this host cannot read: the call fails instead of running again and again."""
    monkeypatch.setenv("IMGEST_STATE_URL", "local")
    monkeypatch.setenv("IMGEST_HOME", str(tmp_path))
    monkeypatch.setattr(detach, "_calls", iter(range(2, 100)))
    monkeypatch.setattr(detach, "_clear_at_exit", lambda run: None)
    done = {"status": DONE, "call": "02-pack-2", "operation_id": "op-1"}
    monkeypatch.setenv(detach.DONE_ENV, json.dumps(done))
    detach.run_results("r2", "02-pack-2").put(0, pickle.dumps([]))
    with pytest.raises(ResultsLostError, match=r"op-1 of 02-pack-2 completed, yet 1 of its 2 .*IMGEST_STATE_URL"):
        detach.kept_call(None, 2, None, logging.getLogger("t"), "pack", "r2")


class _RpcError(grpc.RpcError):
    """A gRPC error as the server's reattach answers it (a server restart cannot be staged on cue here)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def test_the_trigger_reads_the_servers_errors() -> None:
    gone = classify(_RpcError(grpc.StatusCode.INTERNAL, "[INVALID_HANDLE.OPERATION_NOT_FOUND] Operation x not found"))
    assert gone is not None
    assert gone["status"] == GONE
    failed = classify(_RpcError(grpc.StatusCode.INTERNAL, "[PYTHON_EXCEPTION] ValueError: bad shard"))
    assert failed is not None
    assert failed["status"] == FAILED
    assert "bad shard" in failed["error"]
    assert classify(_RpcError(grpc.StatusCode.UNAVAILABLE, "connection refused")) is None  # try again


def test_the_trigger_serializes_what_it_needs() -> None:
    record = {"operation_id": "o", "session_id": "s", "user_id": "", "call": "00-pack-4", "partitions": 4}
    lock = {"dataset": "d", "dag_id": "ingest_imagenet", "run_id": "r", "location": "local:/x"}
    trigger = SparkConnectOperationTrigger("sc://spark:15002", record, "spark_default", lock, poll=5.0)
    path, kwargs = trigger.serialize()
    assert path == "imgest.operators.connect_trigger.SparkConnectOperationTrigger"
    assert SparkConnectOperationTrigger(**kwargs).serialize() == (path, kwargs)
    assert "token" not in json.dumps(kwargs)  # the token is read from the connection when it runs


def test_the_operator_fails_on_the_jobs_error_or_a_lost_lock_and_goes_on_otherwise() -> None:
    from airflow.sdk.exceptions import AirflowException

    from imgest.operators.compat import fail_exception

    with pytest.raises(AirflowException, match="operation op failed on Spark: ValueError: bad"):
        check_event("pack_shards", {"status": FAILED, "operation_id": "op", "error": "ValueError: bad"})
    with pytest.raises(fail_exception(), match="lost the lock"):
        check_event("pack_shards", {"status": LOST, "error": "lost the lock of d"})
    check_event("pack_shards", {"status": DONE})
    with pytest.raises(fail_exception(), match="deferred 21 times"):  # a client that never finds its results
        check_event("pack_shards", {"status": DONE}, deferrals=21)
    check_event("pack_shards", {"status": GONE, "error": "restarted"})  # the client runs what is missing


def test_deferrable_jobs_are_a_deployments_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IMGEST_SPARK_DEFERRABLE", raising=False)
    assert spark_deferrable_default() is False  # no triggerer assumed
    for value, expected in (("1", True), ("true", True), ("0", False), ("", False)):
        monkeypatch.setenv("IMGEST_SPARK_DEFERRABLE", value)
        assert spark_deferrable_default() is expected


def test_each_task_attempt_keeps_its_results_apart() -> None:
    def context(try_number: int, run: str = "manual__1") -> dict[str, Any]:
        ti = SimpleNamespace(dag_id="ingest_imagenet", task_id="ingest_shards", map_index=-1, try_number=try_number)
        return {"ti": ti, "run_id": run}

    assert run_key(context(1)) == run_key(context(1))  # the same attempt after its deferral
    assert run_key(context(1)) != run_key(context(2))  # a retry starts afresh
    assert run_key(context(1)) != run_key(context(1, "manual__2"))


def test_the_runs_partitioning_is_the_first_clients(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Connect server's executors come and go: the client run again plans with the parallelism the first saw."""
    monkeypatch.setenv("IMGEST_STATE_URL", "local")
    monkeypatch.setenv("IMGEST_HOME", str(tmp_path))
    assert detach.pinned("r3", "parallelism", lambda: 4) == 4
    assert detach.pinned("r3", "parallelism", lambda: 1) == 4  # fewer executors now: the run's partitions stay
    assert detach.pinned("r4", "parallelism", lambda: 1) == 1  # another attempt plans afresh


def test_the_follower_blocks_a_thread_of_its_own() -> None:
    import asyncio
    import threading

    from imgest.operators.connect_trigger import in_own_thread

    def blocking(x: int) -> tuple[int, str]:
        return x * 2, threading.current_thread().name

    def failing() -> None:
        raise ValueError("no such operation")

    async def main() -> tuple[Any, Any]:
        ok = await in_own_thread(blocking, 21)
        try:
            await in_own_thread(failing)
        except ValueError as exc:
            return ok, str(exc)
        return ok, None

    assert asyncio.run(main()) == ((42, "imgest-connect-follow"), "no such operation")
