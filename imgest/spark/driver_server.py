"""One long-lived local Spark driver that runs imgest's jobs one after another, for the test suite.

Every spark-submit starts a JVM, a SparkContext and fresh Python workers: 5-20 s before the first task, which
the suite pays about seventy times. With $IMGEST_SPARK_DRIVER_SOCKET set, `run_submit` hands a local job to a
server that keeps one SparkSession: the server imports jobs/JOB.py, calls its ``main(args)`` with the caller's
environment, working folder and log file (stdout and stderr, at the descriptor level), and answers the exit
code. The first job starts the server; `stop` ends it.

A job falls back to spark-submit, exactly as without the server, when it would not run the same way there:
a master other than the server's, Spark settings other than the defaults, another job already running (the server
runs one job at a time), or another identity of its executors' own (``IDENTITY_ENV``: the Python workers keep the
environment of the first job, and renew temporary keys from it as an executor host does from its role). Tests of
spark-submit itself (killed drivers, clusters) call it directly.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import re
import socket
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from imgest.core import unixserver

log = logging.getLogger(__name__)

SOCKET_ENV = "IMGEST_SPARK_DRIVER_SOCKET"
REUSED = "_imgest_reused"  # set on the server's session, which outlives every job (submit.stop_session leaves it)
START_TIMEOUT_S = 180.0
# Where a host's own AWS credentials come from (what an executor renews shipped temporary keys with).
IDENTITY_ENV = (
    "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_ENDPOINT_URL_STS",
)  # fmt: skip


def identity(env: dict[str, str]) -> dict[str, str]:
    """The own-credential sources ENV gives a host (IDENTITY_ENV that are set)."""
    return {k: env[k] for k in IDENTITY_ENV if env.get(k)}


def socket_path() -> Path | None:
    """The server's socket from the environment, or None when jobs go to spark-submit."""
    raw = os.environ.get(SOCKET_ENV, "").strip()
    return Path(raw) if raw else None


def _parse(cmd: list[str]) -> tuple[str, dict[str, str], Path, list[str]] | None:
    """(master, confs, job file, job args) of a submit_command argv, or None when it ships code elsewhere."""
    master, confs, i = "", {}, 1
    while i < len(cmd):
        arg = cmd[i]
        if arg == "--master":
            master = cmd[i + 1]
        elif arg == "--conf":
            key, _, value = cmd[i + 1].partition("=")
            confs[key] = value
        elif arg == "--name":
            pass
        elif arg.endswith(".py"):
            return master, confs, Path(arg), cmd[i + 1 :]
        else:
            return None  # --py-files and anything else: not for a local reused driver
        i += 2
    return None


def _request(cmd: list[str], log_file: Path, env: dict[str, str] | None) -> dict[str, Any] | None:
    """The server request for CMD, or None when CMD must run through spark-submit."""
    from imgest.spark.conf import spark_conf

    parsed = _parse(cmd)
    if parsed is None:
        return None
    master, confs, job, args = parsed
    if not master.startswith("local") or confs != spark_conf(None, master):
        return None
    master = re.sub(r"^local\[\*", f"local[{os.cpu_count() or 1}", master)  # local[*] is local[cores] here
    return {
        "master": master,
        "job": str(job),
        "args": args,
        "env": {**os.environ, **(env or {})},
        "cwd": os.getcwd(),
        "log_file": str(log_file),
    }


def submit(cmd: list[str], log_file: Path, env: dict[str, str] | None = None) -> int | None:
    """Run the spark-submit argv CMD in the reused driver (this environment updated with ENV), output to
    LOG_FILE; None when it must go through spark-submit."""
    path = socket_path()
    if path is None:
        return None
    request = _request(cmd, log_file, env)
    if request is None:
        return None
    with _client_lock(path) as mine:
        if not mine:
            log.info("the reused Spark driver is busy with another job; using spark-submit")
            return None
        conn = _connect(path, request["master"])
        if conn is None:
            return None
        with conn:
            conn.sendall(json.dumps(request).encode() + b"\n")
            reply = conn.makefile("rb").readline()
    if not reply:
        with open(log_file, "a") as out:
            out.write(f"imgest: the reused Spark driver ({path}) exited while running the job\n")
        return 1
    answer = json.loads(reply)
    if answer.get("refused"):
        log.info("the reused Spark driver refused the job (%s); using spark-submit", answer["refused"])
        return None
    return int(answer["rc"])


@contextlib.contextmanager
def _client_lock(path: Path) -> Iterator[bool]:
    """Hold the server for one job: True when this caller got it, False when another job has it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _connect(path: Path, master: str) -> socket.socket | None:
    """A connection to the server at PATH, started for MASTER first if none answers; None if it cannot start."""
    conn = unixserver.try_connect(path)
    if conn is not None:
        return conn
    from imgest.spark.distribution import python_path

    argv = [sys.executable, "-m", "imgest.spark.driver_server", "--socket", str(path), "--master", master]
    first = python_path()  # Spark's own PySpark, not the environment's pyspark-client files
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*first, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    conn = unixserver.start(path, argv, env if first else None, START_TIMEOUT_S)
    if conn is None:
        log.warning("the reused Spark driver did not start (see %s); using spark-submit", path.with_suffix(".log"))
    return conn


def stop(path: Path, timeout: float = 30.0) -> bool:
    """Stop the server at PATH (if any) and wait for it; True when one was running."""
    return unixserver.stop(path, timeout)


# ---------------------------------------------------------------------------------------------- the server side


def _session(master: str) -> Any:
    from pyspark.sql import SparkSession

    from imgest.spark.conf import spark_conf, submit_env

    os.environ.update(submit_env(master))
    builder = SparkSession.builder.master(master).appName("imgest-reused-driver")
    for key, value in spark_conf(None, master).items():
        builder = builder.config(key, value)
    spark = builder.config("spark.ui.showConsoleProgress", "false").getOrCreate()
    spark.stop = lambda: None  # jobs stop their session when done; this one outlives them
    setattr(spark, REUSED, True)  # stop_session leaves it (and its accumulator server) running
    setattr(spark.sparkContext, REUSED, True)  # the same for jobs that take the context alone (build_context)
    return spark


@contextlib.contextmanager
def _as_caller(request: dict[str, Any]) -> Iterator[None]:
    """The caller's environment and folder, stdout and stderr into its log file, restored afterwards."""
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved_fds = (os.dup(1), os.dup(2))
    Path(request["log_file"]).parent.mkdir(parents=True, exist_ok=True)
    with open(request["log_file"], "w") as out:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)


def _forget_process_state(spark: Any) -> None:
    """What one job leaves in this process that spark-submit would have dropped with its driver."""
    from imgest.sinks.cassandra.client import close_shared_sessions
    from imgest.sources import s3objects

    spark.catalog.clearCache()
    for rdd in spark.sparkContext._jsc.getPersistentRDDs().values():
        rdd.unpersist()
    close_shared_sessions()
    s3objects.forget_connections()


def _run(spark: Any, request: dict[str, Any]) -> int:
    job = Path(request["job"])
    with _as_caller(request):
        try:
            spec = importlib.util.spec_from_file_location(f"imgest_job_{job.stem}", job)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load the Spark job {job}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            rc = int(module.main(request["args"]) or 0)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # as spark-submit would: the trace in the log, exit 1
            traceback.print_exc()
            rc = 1
        finally:
            _forget_process_state(spark)
    return rc


def serve(path: Path, master: str) -> None:
    """Accept one job at a time on the Unix socket PATH until asked to stop."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spark = _session(master)
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    log.info("reused Spark driver for %s listening on %s", master, path)
    jobs, executors_as = 0, None  # the identity the executors' Python workers took from the first job
    while True:
        conn, _ = listener.accept()
        with conn:
            line = conn.makefile("rb").readline()
            if not line:
                continue
            request = json.loads(line)
            if request.get("stop"):
                conn.sendall(b'{"stopped": true}\n')
                break
            if request.get("master") != master:
                conn.sendall(json.dumps({"refused": f"serves {master}, not {request.get('master')}"}).encode() + b"\n")
                continue
            if executors_as is not None and identity(request["env"]) != executors_as:
                refused = f"its executors renew credentials as {sorted(executors_as.items())}, not as this job's"
                conn.sendall(json.dumps({"refused": refused}).encode() + b"\n")
                continue
            executors_as = identity(request["env"]) if executors_as is None else executors_as
            t0 = time.monotonic()
            rc = _run(spark, request)
            jobs += 1
            log.info("job %d (%s) exited %d after %.1fs", jobs, Path(request["job"]).stem, rc, time.monotonic() - t0)
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"rc": rc}).encode() + b"\n")
    listener.close()
    path.unlink(missing_ok=True)
    logging.shutdown()
    # Threads a job left behind (driver pools, client sessions) must not keep the server alive, and a clean
    # SparkContext stop takes half a minute: the JVM exits on its own when its parent's pipe closes.
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", type=Path, required=True, help="Unix socket to listen on")
    parser.add_argument("--master", required=True, help="the local master every job it runs uses")
    args = parser.parse_args(argv)
    serve(args.socket, args.master)
    return 0


if __name__ == "__main__":
    sys.exit(main())
