"""A Spark Connect job's wait, off the worker: a trigger that follows the operation its client left running on the
server (imgest.spark.detach) from Airflow's triggerer while the task is deferred, its worker slot free.

It reattaches to the operation (``ReattachExecute`` by operation id: the server keeps a reattachable execution
whose client is gone only for its detached timeout, so someone must stay attached), reads its responses (one
small row per partition: the results are in the run's results folder), and fires when the operation ended:
``{"status": "done"}``, ``{"status": "failed", "error": ...}`` (the job's own error on Spark), or ``{"status":
"gone", "error": ...}`` (the server no longer knows it: restarted, or it gave the execution up; the task runs the
client again, which runs only the partitions whose results are missing). Meanwhile it renews the run's lease on its
dataset's lock (the worker that renewed it is gone): a lock lost fires ``{"status": "lost", ...}``. It logs the
operation's progress (the server's reports in the stream: tasks finished of its tasks) at most every minute, in the
task's log as the attached client's did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent
from asgiref.sync import sync_to_async

log = logging.getLogger(__name__)
DONE, FAILED, GONE, LOST = "done", "failed", "gone", "lost"
# the server's errors that mean it no longer has the operation (or its session): run the client again
GONE_CLASSES = (
    "INVALID_HANDLE.OPERATION_NOT_FOUND",
    "INVALID_HANDLE.OPERATION_ABANDONED",
    "INVALID_HANDLE.SESSION_NOT_FOUND",
    "INVALID_HANDLE.SESSION_CLOSED",
    "INVALID_HANDLE.SESSION_CHANGED",
)
# another attach took the stream over (two triggerers following one operation for a moment): attach again
TRY_AGAIN_CLASSES = ("INVALID_CURSOR.DISCONNECTED",)
# the server has the operation but cannot resume this follower's stream: interrupted, then gone (what finished is kept)
STALE_CLASSES = ("INVALID_CURSOR",)
UNAVAILABLE_FOR_S = 600.0  # a server that does not answer this long: the operation is interrupted and given up
REATTACH_TIMEOUT_S = 600.0  # one reattach's longest wait (the server ends each stream after 2 minutes itself)
PROGRESS_EVERY_S = 60.0  # the deferred job's progress line in the task's log at most this often


class SparkConnectOperationTrigger(BaseTrigger):
    """Follows OPERATION (RECORD: operation_id, session_id, user_id, call; imgest.spark.detach) on the Connect
    server at MASTER (``sc://host:port``), its token the password of SPARK_CONN_ID; renews LOCK's lease (dataset,
    dag_id, run_id, location, aws_conn_id, cassandra_conn_id; {} for none) every POLL seconds."""

    def __init__(
        self, master: str, record: dict[str, Any], spark_conn_id: str, lock: dict[str, Any], poll: float = 30.0
    ) -> None:
        super().__init__()
        self.master, self.record, self.spark_conn_id, self.lock, self.poll = master, record, spark_conn_id, lock, poll
        self._stores: Any = None  # the lock's stores, reached once
        self._renewed = time.monotonic()  # the last renewal that got through (the worker's, when it deferred)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "master": self.master,
                "record": self.record,
                "spark_conn_id": self.spark_conn_id,
                "lock": self.lock,
                "poll": self.poll,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        stop = threading.Event()
        token = await sync_to_async(self._token, thread_sensitive=False)()
        channels: list[Any] = []  # closed when the trigger ends: a blocked reattach ends with it
        progress: dict[str, int] = {}  # the follower's thread writes it, this loop logs it
        follow = in_own_thread(follow_operation, self.master, self.record, token, stop, channels, progress)
        renew = sync_to_async(self._renew, thread_sensitive=False)
        lease = float(self.lock.get("lease_s") or 0)
        every = min(self.poll, lease / 4) if lease > 0 else self.poll  # as the worker renewed it (locks.keep_alive_in)
        t0 = logged = time.monotonic()
        try:
            while True:
                done, _ = await asyncio.wait({follow}, timeout=min(every, PROGRESS_EVERY_S))
                if not done and time.monotonic() - logged >= PROGRESS_EVERY_S:
                    self.log.info(progress_line(self.record, dict(progress), time.monotonic() - t0))
                    logged = time.monotonic()
                if done:
                    event = follow.result()
                    self.log.info("operation %s: %s", self.record.get("operation_id"), event)
                    yield TriggerEvent({**event, "call": self.record.get("call"),
                                        "operation_id": self.record.get("operation_id")})  # fmt: skip
                    return
                lost = await renew()
                if lost:  # the operation must not write on under a lock another run may hold now
                    stop.set()
                    await sync_to_async(interrupt_operation, thread_sensitive=False)(self.master, self.record, token)
                    yield TriggerEvent({"status": LOST, "error": lost, "call": self.record.get("call")})
                    return
        finally:
            stop.set()
            for channel in channels:
                channel.close()

    def _token(self) -> str | None:
        from imgest.operators.compat import connection_or_none

        conn = connection_or_none(self.spark_conn_id)
        return conn.password if conn is not None and conn.password else None

    def _renew(self) -> str:
        """'' when the run still holds its dataset's lock (its lease renewed, or a store away for less than a
        lease), else why not: the lock taken by another or in another epoch, a later attempt of the task, or no
        renewal through for a whole lease (as locks.keep_alive_in decides on the worker)."""
        if not self.lock:
            return ""
        from imgest.core import locks

        lock = self.lock
        dataset, lease = lock["dataset"], float(lock.get("lease_s") or 0)
        holder = locks.airflow_holder(lock["dag_id"], lock["run_id"], lease_s=lease or None)
        attempt = locks.Attempt(str(lock["task_id"]), int(lock["try_number"])) if lock.get("task_id") else None
        try:
            if self._stores is None:
                from imgest.operators.hooks import lock_stores_at

                self._stores = lock_stores_at(lock["location"], lock["aws_conn_id"], lock["cassandra_conn_id"]).stores
            epochs = list(lock.get("epochs") or []) + [None] * len(self._stores)
            for store, epoch in zip(self._stores, epochs, strict=False):
                if not locks.renew(dataset, holder, store, attempt, epoch):
                    return f"lost the lock of {dataset} while its job ran on Spark ({holder.who})"
            self._renewed = time.monotonic()
        except Exception as exc:  # a store away for a moment: the next poll tries again, for at most a lease
            away = time.monotonic() - self._renewed
            if lease > 0 and away >= lease:
                return f"the lease of {dataset} ran out: no renewal got through for {away:.0f} s (last: {exc})"
            self.log.warning("could not renew the lock of %s: %s", dataset, exc)
        return ""


def in_own_thread(call: Any, *args: Any) -> asyncio.Future[Any]:
    """CALL(*ARGS) in a thread of its own (it blocks for the operation's hours: never one of the loop's shared
    executor threads, which every trigger's sync_to_async needs), as a future of the running loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, exc: BaseException | None) -> None:
        if future.done():
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (call(*args), None)
        except BaseException as exc:
            outcome = (None, exc)
        if not loop.is_closed():  # a triggerer that stopped meanwhile wants nothing back
            with contextlib.suppress(RuntimeError):  # closed in between
                loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=run, name="imgest-connect-follow", daemon=True).start()
    return future


def follow_operation(
    master: str,
    record: dict[str, Any],
    token: str | None,
    stop: threading.Event,
    channels: list[Any] | None = None,
    progress: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Stay attached to RECORD's operation on MASTER until it ends (blocking; STOP ends it early, and so does closing
    the channel it appends to CHANNELS): its event. PROGRESS gets the server's progress reports (note_progress)."""
    import grpc

    connect_importable()
    from pyspark.sql.connect.client.core import DefaultChannelBuilder
    from pyspark.sql.connect.proto import base_pb2 as pb2
    from pyspark.sql.connect.proto import base_pb2_grpc

    builder = DefaultChannelBuilder(master)
    if token:
        builder.set("token", token)
    channel = builder.toChannel()
    if channels is not None:
        channels.append(channel)
    stub = base_pb2_grpc.SparkConnectServiceStub(channel)
    last, unanswered = "", None
    user = pb2.UserContext(user_id=record.get("user_id") or "")
    try:
        while not stop.is_set():
            req = pb2.ReattachExecuteRequest(
                session_id=record["session_id"],
                user_context=user,
                operation_id=record["operation_id"],
                client_type="imgest-trigger",
            )
            if last:
                req.last_response_id = last
            received = False
            try:
                for resp in stub.ReattachExecute(req, metadata=builder.metadata(), timeout=REATTACH_TIMEOUT_S):
                    last, received, unanswered = resp.response_id, True, None
                    if progress is not None and resp.HasField("execution_progress"):
                        note_progress(progress, resp.execution_progress)
                    if resp.HasField("result_complete"):
                        _release(stub, builder, record, user)
                        return {"status": DONE}
                unanswered = None
            except grpc.RpcError as exc:
                event = classify(exc)
                if event is not None:
                    return _given_up(stub, builder, record, user, event)
                unanswered = unanswered or time.monotonic()
                if time.monotonic() - unanswered > UNAVAILABLE_FOR_S:
                    error = f"the server did not answer for {UNAVAILABLE_FOR_S:.0f} s: {exc}"
                    return _given_up(stub, builder, record, user, {"status": GONE, "error": error, "stale": True})
            if not received:
                stop.wait(2.0)  # a stream that ended or failed at once: not a busy loop
        return {"status": GONE, "error": "stopped"}
    finally:
        channel.close()


def note_progress(progress: dict[str, int], report: Any) -> None:
    """PROGRESS after one of the server's ExecutionProgress REPORTs: its stages' tasks, those finished (never fewer
    than an earlier report said: a reattach replays the stream) and those running."""
    stages = list(report.stages)
    progress["tasks"] = max(progress.get("tasks", 0), sum(int(s.num_tasks) for s in stages))
    progress["finished"] = max(progress.get("finished", 0), sum(int(s.num_completed_tasks) for s in stages))
    progress["running"] = int(report.num_inflight_tasks)
    progress["reports"] = progress.get("reports", 0) + 1


def progress_line(record: dict[str, Any], progress: dict[str, int], seconds: float) -> str:
    """The deferred job's progress as the task's log shows it."""
    what = f"operation {record.get('operation_id')} ({record.get('call')}, {record.get('partitions', '?')} partitions)"
    if not progress.get("reports"):
        return f"{what}: running on Spark for {seconds:.0f} s, no progress report from the server yet"
    return (
        f"{what}: {progress['finished']}/{progress['tasks']} tasks finished, {progress['running']} running, "
        f"{seconds:.0f} s followed"
    )


def _given_up(stub: Any, builder: Any, record: dict[str, Any], user: Any, event: dict[str, Any]) -> dict[str, Any]:
    """EVENT, the operation interrupted first where the server may still run it (``stale``): a client run again
    must not start its missing partitions beside it."""
    if event.pop("stale", False):
        _interrupt(stub, builder, record, user)
    return event


def interrupt_operation(master: str, record: dict[str, Any], token: str | None) -> None:
    """Interrupt RECORD's operation on MASTER (best effort: the server gives up an operation nobody follows after
    its detached timeout anyway)."""
    connect_importable()
    from pyspark.sql.connect.client.core import DefaultChannelBuilder
    from pyspark.sql.connect.proto import base_pb2 as pb2
    from pyspark.sql.connect.proto import base_pb2_grpc

    builder = DefaultChannelBuilder(master)
    if token:
        builder.set("token", token)
    channel = builder.toChannel()
    try:
        stub = base_pb2_grpc.SparkConnectServiceStub(channel)
        _interrupt(stub, builder, record, pb2.UserContext(user_id=record.get("user_id") or ""))
    finally:
        channel.close()


def _interrupt(stub: Any, builder: Any, record: dict[str, Any], user: Any) -> None:
    from pyspark.sql.connect.proto import base_pb2 as pb2

    try:
        req = pb2.InterruptRequest(session_id=record["session_id"], user_context=user, client_type="imgest-trigger",
                                   interrupt_type=pb2.InterruptRequest.INTERRUPT_TYPE_OPERATION_ID,
                                   operation_id=record["operation_id"])  # fmt: skip
        stub.Interrupt(req, metadata=builder.metadata(), timeout=60)
        log.info("interrupted operation %s", record["operation_id"])
    except Exception as exc:
        log.warning("could not interrupt operation %s: %s", record["operation_id"], exc)


def connect_importable() -> None:
    """Let pyspark.sql.connect be imported here: its first import takes a process whose ``__main__`` has neither spec
    nor file (``python -c``: pytest-xdist's workers) for a doctest run, looks for a Spark home and exits without one.
    There, give it the Spark imgest finds (the triggerer, the CLI and Airflow's tasks are never such a process)."""
    import os
    import sys

    main = sys.modules.get("__main__")
    doctest_like = main is not None and getattr(main, "__spec__", None) is None and not hasattr(main, "__file__")
    if doctest_like and "SPARK_HOME" not in os.environ and "pyspark.sql.connect" not in sys.modules:
        from imgest.spark.distribution import spark_home

        home = spark_home()
        if home is not None:
            os.environ["SPARK_HOME"] = str(home)


def classify(exc: Any) -> dict[str, Any] | None:
    """The event a gRPC error of a reattach means: gone, failed, or None (the server is away: try again)."""
    import grpc

    details = str(exc.details() or "") if hasattr(exc, "details") else str(exc)
    code = exc.code() if hasattr(exc, "code") else None
    if any(c in details for c in TRY_AGAIN_CLASSES):
        return None
    if any(c in details for c in GONE_CLASSES):
        return {"status": GONE, "error": details[:2000]}
    if any(c in details for c in STALE_CLASSES):
        return {"status": GONE, "error": details[:2000], "stale": True}
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
        return None
    return {"status": FAILED, "error": details[:4000]}


def _release(stub: Any, builder: Any, record: dict[str, Any], user: Any) -> None:
    """Let the server free the operation's kept responses (best effort: it frees them after its timeout anyway)."""
    from pyspark.sql.connect.proto import base_pb2 as pb2

    try:
        req = pb2.ReleaseExecuteRequest(session_id=record["session_id"], user_context=user,
                                        operation_id=record["operation_id"], client_type="imgest-trigger",
                                        release_all=pb2.ReleaseExecuteRequest.ReleaseAll())  # fmt: skip
        stub.ReleaseExecute(req, metadata=builder.metadata())
    except Exception as exc:  # nothing depends on it
        log.debug("releasing %s: %s", record["operation_id"], exc)
