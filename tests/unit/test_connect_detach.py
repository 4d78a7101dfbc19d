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
    # another attach took the stream over (two triggerers for a moment): attach again, never "gone"
    assert classify(_RpcError(grpc.StatusCode.INTERNAL, "[INVALID_CURSOR.DISCONNECTED] taken over")) is None
    # the server still has the operation but cannot resume this stream: gone, after interrupting it
    stale = classify(_RpcError(grpc.StatusCode.INTERNAL, "[INVALID_CURSOR.POSITION_NOT_AVAILABLE] released"))
    assert stale == {"status": GONE, "error": "[INVALID_CURSOR.POSITION_NOT_AVAILABLE] released", "stale": True}


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
    check_event("pack_shards", {"status": GONE, "error": "restarted"})  # the client runs what is missing


def test_after_its_deferrals_a_run_stays_attached(tmp_path: Path) -> None:
    """A client that never finds what its executors kept would start its partitions forever: after MAX_DEFERRALS
    the client runs without the detach file (attached to its end, failing naming the folder if results are lost)."""
    from imgest.operators.connect_job import MAX_DEFERRALS, defer_env, detaches

    ti = SimpleNamespace(dag_id="d", task_id="t", map_index=-1, try_number=1)
    context = {"ti": ti, "run_id": "r"}
    with defer_env(context, {}) as first:
        assert set(first) == {detach.RUN_ENV, detach.DETACH_ENV}
    resumed = {"status": DONE, "call": "00-pack-2", "deferrals": MAX_DEFERRALS}
    assert not detaches(resumed)
    with defer_env(context, resumed) as last:
        assert set(last) == {detach.RUN_ENV, detach.DONE_ENV}  # the same run's results, no detaching
        assert last[detach.RUN_ENV] == first[detach.RUN_ENV]
    with defer_env(context, None) as attached:
        assert attached == {}


def test_an_exit_as_if_detached_without_a_record_says_so(tmp_path: Path) -> None:
    from airflow.sdk.exceptions import AirflowException

    from imgest.operators.connect_job import detached_record

    with pytest.raises(AirflowException, match="recorded no operation"):
        detached_record("pack_shards", {detach.DETACH_ENV: str(tmp_path / "detached.json")})
    (tmp_path / "detached.json").write_text(json.dumps({"operation_id": "o"}))
    assert detached_record("pack_shards", {detach.DETACH_ENV: str(tmp_path / "detached.json")}) == {"operation_id": "o"}


def test_results_on_s3_under_any_bucket_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """The results folder's URL is the state URL's bucket and prefix, whatever the bucket is called."""
    monkeypatch.setenv("IMGEST_S3_ENDPOINT", "http://s3.example:8333")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    for url, folder in (
        ("s3://staging-bucket/state", "s3://staging-bucket/state/staging/connect/r/00-pack-2/"),
        ("s3://staging-bucket", "s3://staging-bucket/staging/connect/r/00-pack-2/"),
        ("s3://b/p/q/", "s3://b/p/q/staging/connect/r/00-pack-2/"),
    ):
        monkeypatch.setenv("IMGEST_STATE_URL", url)
        results = detach.run_results("r", "00-pack-2")
        assert (results.url, results.remote) == (folder, True)


def test_a_deferrable_runs_staged_files_live_in_its_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that left its operation running exits without closing its Stager: its files are staged at the same
    names each run, inside the run's folder (which the run's last client or the operator removes)."""
    from imgest.core import staging

    monkeypatch.setenv("IMGEST_CONNECT_RUN", "abc")
    monkeypatch.setattr(staging, "_stagers", iter(range(5)))
    assert staging._run_folder("imagenet") == "connect/abc/staged-0"
    monkeypatch.setattr(staging, "_stagers", iter(range(5)))
    assert staging._run_folder("imagenet") == "connect/abc/staged-0"  # the next client's run: the same folder
    monkeypatch.delenv("IMGEST_CONNECT_RUN")
    assert staging._run_folder("imagenet").startswith("imagenet/")  # a job attached: a folder of its own


def test_the_trigger_renews_as_the_worker_did_and_says_when_it_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trigger renews with the task attempt and the lock's epoch the worker held; a lock another took, or a
    lease through which no renewal got, is lost; a store away for less than a lease is tried again."""
    from imgest.core import locks

    calls: list[tuple[Any, ...]] = []
    answers: list[Any] = [True, ConnectionError("away"), False]

    def renew(dataset: str, holder: Any, store: Any, attempt: Any = None, epoch: Any = None) -> bool:
        calls.append((dataset, holder.who, store, attempt, epoch))
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return bool(answer)

    monkeypatch.setattr(locks, "renew", renew)
    lock = {"dataset": "d", "dag_id": "g", "run_id": "r", "task_id": "t", "try_number": 2, "epochs": ["e1"],
            "lease_s": 600.0, "location": "local:/x", "aws_conn_id": "a", "cassandra_conn_id": "c"}  # fmt: skip
    trigger = SparkConnectOperationTrigger("sc://spark:15002", {}, "spark_default", lock)
    trigger._stores = ["store-1"]
    assert trigger._renew() == ""
    assert calls[0] == ("d", "Airflow DAG g run r", "store-1", locks.Attempt("t", 2), "e1")
    assert trigger._renew() == ""  # away for a moment
    assert "lost the lock of d" in trigger._renew()
    answers.append(ConnectionError("still away"))
    trigger._renewed -= 601  # no renewal through for a whole lease
    assert "the lease of d ran out" in trigger._renew()


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


def test_the_trigger_logs_the_servers_progress(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server's progress reports, as a reattach reads them (a replay never counts back), logged while deferred."""
    import asyncio
    import time

    import structlog.testing

    from imgest.operators import connect_trigger as ct

    ct.connect_importable()
    from pyspark.sql.connect.proto import base_pb2 as pb2

    report = pb2.ExecutePlanResponse.ExecutionProgress
    record = {"operation_id": "op-1", "call": "00-pack-8", "partitions": 8}
    progress: dict[str, int] = {}
    assert "no progress report from the server yet" in ct.progress_line(record, progress, 12)
    ct.note_progress(
        progress, report(stages=[report.StageInfo(num_tasks=8, num_completed_tasks=3)], num_inflight_tasks=2)
    )
    ct.note_progress(
        progress, report(stages=[report.StageInfo(num_tasks=8, num_completed_tasks=1)], num_inflight_tasks=2)
    )
    line = ct.progress_line(record, progress, 75)
    assert line == "operation op-1 (00-pack-8, 8 partitions): 3/8 tasks finished, 2 running, 75 s followed"

    def follow(master: str, rec: Any, token: Any, stop: Any, channels: Any, seen: dict[str, int]) -> dict[str, Any]:
        seen.update(tasks=8, finished=5, running=3, reports=1)
        time.sleep(0.5)
        return {"status": DONE}

    monkeypatch.setattr(ct, "follow_operation", follow)
    monkeypatch.setattr(ct, "PROGRESS_EVERY_S", 0.1)
    trigger = SparkConnectOperationTrigger("sc://spark:15002", record, "spark_default", {}, poll=30.0)
    monkeypatch.setattr(trigger, "_token", lambda: None)

    async def events() -> list[Any]:
        return [event async for event in trigger.run()]

    with structlog.testing.capture_logs() as logged:  # the trigger's log is Airflow's structlog logger
        [event] = asyncio.run(events())
    assert event.payload["status"] == DONE
    assert any("5/8 tasks finished, 3 running" in str(e.get("event")) for e in logged), logged


def test_bench_connect_plots_the_worker_held_beside_the_wall(tmp_path: Path) -> None:
    """`imgest bench connect --plot X`: X (peak RSS per route) and X-held (the seconds a worker slot was held)."""
    from imgest.bench.connect import plots

    rows = [
        {"size": "143k", "target": t, "route": r, "worker_peak_rss_mb": 200.0 + i, "worker_held_s": 10.0 + i,
         "wall_s": 60.0 + i}
        for t in ("cassandra", "shards")
        for i, r in enumerate(("spark-submit", "connect", "connect-deferred"))
    ]  # fmt: skip
    plots(rows, tmp_path / "connect.png")
    for name in ("connect.png", "connect-held.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
