"""A Spark Connect job that lets go of its Airflow worker while Spark runs its partitions (a deferrable job).

Through Spark Connect the job's driver is the server; this process (the task's thin client) only plans, hands each
``run_partitions`` to the server and publishes what the partitions returned. With ``$IMGEST_CONNECT_RUN`` set (the
task attempt's key, by the operator), each partition's results go from its executor to a **results folder** for that
run and call: ``<state URL>/staging/connect/<run>/<call>/part-<index>.pkl`` on object storage where
``$IMGEST_STATE_URL`` is set (executors that share no disk with the worker), else the same absolute path under the
state folder (one machine, or a folder every node mounts). A call whose every partition's results are there is not
run again: the client re-run after a detached operation (or after one the server lost) runs only what is missing.

With ``$IMGEST_CONNECT_DETACH`` (a file) set too, a call with partitions to run starts them as a *reattachable*
execution with an operation id of its own, waits until the server reports it running, writes what a watcher needs
to follow it (endpoint-free: operation id, session id, user id) into that file and exits with ``DETACHED_EXIT``
without releasing anything: the server goes on running it. The operator then defers to a trigger that reattaches
to the operation (imgest.operators.connect_trigger) and, once it ended, runs the client again, which finds the
results and goes on (to its next call, which detaches again, or to its end).

``$IMGEST_CONNECT_DONE`` carries the trigger's last event: a call whose operation the trigger saw complete yet whose
results are missing fails, naming the folder (executors that wrote where this host cannot read), instead of
running again and again.
"""

from __future__ import annotations

import atexit
import itertools
import json
import logging
import os
import pickle
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from imgest.core.settings import S3Settings

RUN_ENV = "IMGEST_CONNECT_RUN"
DETACH_ENV = "IMGEST_CONNECT_DETACH"
DONE_ENV = "IMGEST_CONNECT_DONE"
DETACHED_EXIT = 75  # EX_TEMPFAIL: the job goes on on Spark; run this client again once its operation ended
START_WAIT_S = 120.0  # how long the client waits for the server to report its operation running
_calls = itertools.count()


class ResultsLostError(RuntimeError):
    """A detached operation completed but its partitions' results are not where this client reads them."""


@dataclass(frozen=True)
class Results:
    """One call's results folder: URL is ``s3://bucket/prefix/`` or an absolute local folder (ending in /)."""

    url: str
    s3: S3Settings | None = field(default=None, repr=False)

    @property
    def remote(self) -> bool:
        return self.url.startswith("s3://")

    def _key(self, index: int) -> str:
        return f"part-{index:06d}.pkl"

    def _bucket_prefix(self) -> tuple[str, str]:
        bucket, _, prefix = self.url.removeprefix("s3://").partition("/")
        return bucket, prefix

    def put(self, index: int, blob: bytes) -> None:
        """Keep partition INDEX's pickled results (whole or not at all)."""
        self.put_named(self._key(index), blob)

    def put_named(self, name: str, blob: bytes) -> None:
        """Keep BLOB as NAME in the folder (whole or not at all)."""
        if self.remote:
            bucket, prefix = self._bucket_prefix()
            assert self.s3 is not None
            self.s3.client().put_object(Bucket=bucket, Key=prefix + name, Body=blob)
            return
        folder = Path(self.url)
        folder.mkdir(parents=True, exist_ok=True)
        part = folder / f".{name}.{uuid.uuid4().hex}"
        part.write_bytes(blob)
        os.replace(part, folder / name)

    def get_named(self, name: str) -> bytes:
        """What NAME holds (FileNotFoundError, or S3's NoSuchKey, when nothing)."""
        if self.remote:
            bucket, prefix = self._bucket_prefix()
            assert self.s3 is not None
            return bytes(self.s3.client().get_object(Bucket=bucket, Key=prefix + name)["Body"].read())
        return (Path(self.url) / name).read_bytes()

    def have(self) -> set[int]:
        """The partitions whose results are kept."""
        names: list[str] = []
        if self.remote:
            bucket, prefix = self._bucket_prefix()
            assert self.s3 is not None
            pages = self.s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            names = [o["Key"].removeprefix(prefix) for page in pages for o in page.get("Contents", [])]
        elif Path(self.url).is_dir():
            names = [p.name for p in Path(self.url).iterdir()]
        return {int(n[5:-4]) for n in names if n.startswith("part-") and n.endswith(".pkl")}

    def get(self, index: int) -> bytes:
        return self.get_named(self._key(index))

    def clear(self) -> None:
        """Remove the folder and what is in it."""
        if not self.remote:
            shutil.rmtree(self.url, ignore_errors=True)
            return
        bucket, prefix = self._bucket_prefix()
        assert self.s3 is not None
        from imgest.core.s3_prefix import delete_prefix

        delete_prefix(self.s3.client(), bucket, prefix)


def run_results(run: str, call: str = "") -> Results:
    """The results folder of RUN's CALL ('' : the whole run's), where its executors can write (module doc)."""
    from imgest.core.bucket_region import for_bucket
    from imgest.core.lock_stores import state_url

    url = state_url()
    tail = f"connect/{run}/" + (f"{call}/" if call else "")
    if url:
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        s3 = for_bucket(S3Settings.from_env().frozen(), bucket)
        key = f"{prefix.strip('/')}/staging/{tail}".lstrip("/")
        return Results(f"s3://{bucket}/{key}", s3)
    from imgest.core.paths import state_dir

    return Results(f"{state_dir() / 'staging' / tail}")


def pinned(run: str, name: str, compute: Any) -> int:
    """NAME's value for RUN: COMPUTE()'s on the run's first client, kept in its results folder for the ones after (a
    Connect server's executors come and go with dynamic allocation: the re-run must plan the partitions it ran)."""
    results = run_results(run)
    try:
        return int(json.loads(results.get_named(f"{name}.json"))["value"])
    except Exception as exc:
        if not _absent(exc):
            raise
    value = int(compute())
    results.put_named(f"{name}.json", json.dumps({"value": value}).encode())
    return value


def _absent(exc: Exception) -> bool:
    """EXC says the object or file is not there."""
    if isinstance(exc, FileNotFoundError):
        return True
    code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
    return code in ("NoSuchKey", "404")


def kept_call(spark: Any, count: int, work: Any, log: logging.Logger, what: str, run: str) -> list[Any]:
    """run_partitions through Connect with each partition's results kept in RUN's results folder (module doc)."""
    from imgest.spark.progress import connect_progress

    call = f"{next(_calls):02d}-{what}-{count}"
    results = run_results(run, call)
    _clear_at_exit(run)
    missing = sorted(set(range(count)) - results.have())
    if missing:
        _fail_if_lost(call, results, missing, count)
        frame = spark.range(0, count, 1, count).mapInArrow(keeping(work, results, frozenset(missing)), "part long")
        if os.environ.get(DETACH_ENV) and reports_operations(spark, log):
            detach(spark, frame, call, len(missing), count, log, what)
        with connect_progress(spark, log, what, count):
            frame.collect()
        still = sorted(set(range(count)) - results.have())
        if still:
            raise ResultsLostError(f"{what}: {len(still)} of {count} partitions' results are not in {results.url}")
    else:
        log.info("%s: the results of its %d partitions were kept by the detached run (%s)", what, count, results.url)
    return [r for index in range(count) for r in pickle.loads(results.get(index))]


def keeping(work: Any, results: Results, missing: frozenset[int]) -> Any:
    """The mapInArrow task of a kept call: WORK for each partition in MISSING, its results into RESULTS."""
    from imgest.spark.progress import uncounted

    def task(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for batch in batches:
            for index in batch.column(0).to_pylist():
                if index not in missing:
                    continue
                out = list(work(index, uncounted))
                results.put(index, pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL))
                yield pa.RecordBatch.from_pydict({"part": [index]}, pa.schema([("part", pa.int64())]))

    return task


def _fail_if_lost(call: str, results: Results, missing: list[int], count: int) -> None:
    """ResultsLostError when the trigger saw this CALL's operation complete and its results are still MISSING."""
    done = json.loads(os.environ.get(DONE_ENV) or "{}")
    if done.get("call") == call and done.get("status") == "done":
        raise ResultsLostError(
            f"the detached operation {done.get('operation_id')} of {call} completed, yet {len(missing)} of its "
            f"{count} partitions' results are not in {results.url}: executors that do not share this host's disk "
            "write them where it reads them only with IMGEST_STATE_URL=s3://bucket/prefix (docs/cluster.md)"
        )


def forget_run(run: str) -> None:
    """Remove RUN's results folder (and what its jobs staged in it): the operator's, where no client of the run will
    run again (its operation failed, its lock was lost, too many deferrals)."""
    run_results(run).clear()


def _clear_at_exit(run: str) -> None:
    """Remove the run's results when this client ends (its last call done, or failed); a detached client leaves by
    os._exit, so they stay for its next run."""
    if not getattr(_clear_at_exit, "registered", False):
        atexit.register(lambda: run_results(run).clear())
        _clear_at_exit.registered = True  # type: ignore[attr-defined]


def reports_operations(spark: Any, log: logging.Logger) -> bool:
    """Whether the server answers GetStatus (Spark 4.1 and later): without it nothing tells the client that its
    operation runs, so the job stays attached (and says so)."""
    try:
        spark.client._get_operation_statuses([])
        return True
    except Exception as exc:
        log.warning("the Spark Connect server does not report its operations (%s): this job runs attached", exc)
        return False


def detach(spark: Any, frame: Any, call: str, pending: int, count: int, log: logging.Logger, what: str) -> NoReturn:
    """Start FRAME's execution as a reattachable operation, wait until the server runs it, record it in the detach
    file and leave (DETACHED_EXIT) without releasing it."""
    from pyspark.sql.connect.proto import base_pb2 as pb2

    client = spark.client
    operation = str(uuid.uuid4())
    req = client._execute_plan_request_with_metadata(operation_id=operation)
    req.plan.CopyFrom(frame._plan.to_proto(client))
    req.request_options.append(
        pb2.ExecutePlanRequest.RequestOption(reattach_options=pb2.ReattachOptions(reattachable=True))
    )
    stream = client._stub.ExecutePlan(req, metadata=client._builder.metadata())
    state = wait_started(client, operation, stream)
    record = {
        "operation_id": operation,
        "session_id": client._session_id,
        "user_id": client._user_id or "",
        "call": call,
        "what": what,
        "partitions": pending,
        "count": count,
        "state": state,
    }
    Path(os.environ[DETACH_ENV]).write_text(json.dumps(record))
    log.info("%s: %d of %d partitions running on Spark as operation %s (%s); this client lets go of it", what,
             pending, count, operation, state)  # fmt: skip
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    stream.cancel()  # a reattachable execution goes on without its client
    os._exit(DETACHED_EXIT)


def wait_started(client: Any, operation: str, stream: Any, timeout: float = START_WAIT_S) -> str:
    """The operation's state once the server runs it (or it already ended); RuntimeError after TIMEOUT, the
    stream's own error where the server refused it."""
    deadline = time.monotonic() + timeout
    while True:
        statuses = client._get_operation_statuses([operation]).operation_statuses
        names = [_state_name(s.state) for s in statuses if s.operation_id == operation]
        if names and names[0] in ("RUNNING", "TERMINATING", "SUCCEEDED"):
            return names[0]
        if (names and names[0] in ("FAILED", "CANCELLED")) or stream.done():
            for _ in stream:  # raises the server's error
                pass
            return names[0] if names else "ENDED"
        if time.monotonic() >= deadline:
            stream.cancel()  # a reattachable execution outlives its stream: interrupt it, not to leave it running
            try:
                client.interrupt_operation(operation)
            except Exception as exc:  # the server gives it up after its detached timeout anyway
                logging.getLogger(__name__).warning("could not interrupt operation %s: %s", operation, exc)
            raise RuntimeError(f"Spark Connect did not report operation {operation} running within {timeout:.0f} s")
        time.sleep(0.2)


def _state_name(state: int) -> str:
    from pyspark.sql.connect.proto import base_pb2 as pb2

    name = pb2.GetStatusResponse.OperationStatus.OperationState.Name(state)
    return str(name).removeprefix("OPERATION_STATE_")
