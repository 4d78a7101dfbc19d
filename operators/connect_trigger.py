"""A Spark Connect job's wait, off the worker: a trigger that follows the operation its client left running on the
server (imgest.spark.detach) from Airflow's triggerer while the task is deferred, its worker slot free.

It reattaches to the operation (``ReattachExecute`` by operation id: the server keeps a reattachable execution
whose client is gone only for its detached timeout, so someone must stay attached), reads its responses (one
small row per partition: the results are in the run's results folder), and fires when the operation ended:
``{"status": "done"}``, ``{"status": "failed", "error": ...}`` (the job's own error on Spark), or ``{"status":
"gone", "error": ...}`` (the server no longer knows it: restarted, or it gave the execution up; the task runs the
client again, which runs only the partitions whose results are missing). Meanwhile it renews the run's lease on its
dataset's lock (the worker that renewed it is gone): a lock lost fires ``{"status": "lost", ...}``.
"""

from __future__ import annotations

import asyncio
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
GONE_CLASSES = ("INVALID_HANDLE.OPERATION_NOT_FOUND", "INVALID_HANDLE.OPERATION_ABANDONED",
                "INVALID_HANDLE.SESSION_NOT_FOUND", "INVALID_HANDLE.SESSION_CLOSED", "INVALID_HANDLE.SESSION_CHANGED",
                "INVALID_CURSOR")  # fmt: skip
UNAVAILABLE_FOR_S = 300.0  # a server that does not answer this long: the operation is given up as gone


class SparkConnectOperationTrigger(BaseTrigger):
    """Follows OPERATION (RECORD: operation_id, session_id, user_id, call; imgest.spark.detach) on the Connect
    server at MASTER (``sc://host:port``), its token the password of SPARK_CONN_ID; renews LOCK's lease (dataset,
    dag_id, run_id, location, aws_conn_id, cassandra_conn_id; {} for none) every POLL seconds."""

    def __init__(
        self, master: str, record: dict[str, Any], spark_conn_id: str, lock: dict[str, str], poll: float = 30.0
    ) -> None:
        super().__init__()
        self.master, self.record, self.spark_conn_id, self.lock, self.poll = master, record, spark_conn_id, lock, poll
        self._channel: Any = None

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
        follow = in_own_thread(follow_operation, self.master, self.record, token, stop, channels)
        renew = sync_to_async(self._renew, thread_sensitive=False)
        try:
            while True:
                done, _ = await asyncio.wait({follow}, timeout=self.poll)
                if done:
                    event = follow.result()
                    self.log.info("operation %s: %s", self.record.get("operation_id"), event)
                    yield TriggerEvent({**event, "call": self.record.get("call"),
                                        "operation_id": self.record.get("operation_id")})  # fmt: skip
                    return
                lost = await renew()
                if lost:
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
        """'' when the run still holds its dataset's lock (its lease renewed), else why not."""
        if not self.lock:
            return ""
        from imgest.core import locks
        from imgest.operators.hooks import lock_stores_at

        lock = self.lock
        stores = lock_stores_at(lock["location"], lock["aws_conn_id"], lock["cassandra_conn_id"])
        holder = locks.airflow_holder(lock["dag_id"], lock["run_id"])
        for store in stores.stores:
            try:
                epoch = locks.learn_epoch(lock["dataset"], holder, store)
                if epoch is None or not locks.renew(lock["dataset"], holder, store, epoch=epoch):
                    return f"lost the lock of {lock['dataset']} while its job ran on Spark ({holder.who})"
            except Exception as exc:  # a store away for a moment: the next poll tries again
                self.log.warning("could not renew the lock of %s: %s", lock["dataset"], exc)
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
            result = call(*args)
        except BaseException as exc:
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=run, name="imgest-connect-follow", daemon=True).start()
    return future


def follow_operation(
    master: str, record: dict[str, Any], token: str | None, stop: threading.Event, channels: list[Any] | None = None
) -> dict[str, Any]:
    """Stay attached to RECORD's operation on MASTER until it ends (blocking; STOP ends it early, and so does closing
    the channel it appends to CHANNELS): its event."""
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
            try:
                for resp in stub.ReattachExecute(req, metadata=builder.metadata()):
                    last = resp.response_id
                    if resp.HasField("result_complete"):
                        _release(stub, builder, record, user)
                        return {"status": DONE}
                unanswered = None
            except grpc.RpcError as exc:
                event = classify(exc)
                if event is not None:
                    return event
                unanswered = unanswered or time.monotonic()
                if time.monotonic() - unanswered > UNAVAILABLE_FOR_S:
                    return {"status": GONE, "error": f"the server did not answer for {UNAVAILABLE_FOR_S:.0f} s: {exc}"}
                stop.wait(2.0)
        return {"status": GONE, "error": "stopped"}
    finally:
        channel.close()


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
    if any(c in details for c in GONE_CLASSES):
        return {"status": GONE, "error": details[:2000]}
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
