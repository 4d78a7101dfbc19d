"""Spark plumbing: the one SparkSession builder, and the spark-submit command for imgest's jobs."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

from imgest.core.defaults import LOCAL_MASTER, TASK_MAX_FAILURES
from imgest.core.errors import ImgestError
from imgest.core.paths import PACKAGE_DIR, jobs_dir, sql_dir, state_dir
from imgest.spark.conf import needs_shipping, spark_conf, submit_env
from imgest.spark.partitions import REMOTE_ENV, REMOTE_OPTION, is_connect

log = logging.getLogger(__name__)


def build_session(app_name: str) -> Any:
    """The job's SparkSession; the master and resources come from spark-submit, never from here. Run through Spark
    Connect ($SPARK_REMOTE, set by run_submit for an ``sc://`` master), a Connect session: no JVM in this process."""
    from pyspark.sql import SparkSession

    remote = os.environ.get(REMOTE_ENV)
    if remote:
        return connect_session(remote, app_name)
    spark = (
        SparkSession.builder.appName(app_name)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    return spark


def connect_session(remote: str, app_name: str) -> Any:
    """A Spark Connect session at REMOTE (``sc://host:port``; a token from $SPARK_CONNECT_AUTHENTICATE_TOKEN, never
    in the URL a command line shows), tagged with APP_NAME; ConfigError naming the endpoint when it does not answer."""
    from pyspark.sql import SparkSession

    from imgest.core.errors import ConfigError

    try:
        spark = SparkSession.builder.remote(remote).getOrCreate()
        spark.addTag(app_name)
        spark.range(1).collect()  # the server answers (the builder connects lazily)
    except Exception as exc:
        raise ConfigError(
            f"Spark Connect at {remote} did not answer ({type(exc).__name__}: {str(exc).splitlines()[0][:300]}); is "
            "the server running (`imgest services up spark-connect`), and is the Spark connection's host right?"
        ) from None
    return spark


def stop_session(spark: Any) -> None:
    """End a job's session as ``spark.stop()`` does, without PySpark's wait for its accumulator server: the server's
    handler polls its socket once a second, so ``shutdown`` waited up to a second (0.93 s measured) after every
    job. The server's thread is a daemon; its handler leaves at its next poll or with the process. The reused
    driver's session (driver_server) is left running."""
    from imgest.spark.driver_server import REUSED
    from imgest.spark.partitions import connected

    if connected(spark):  # the server's session ends; the server and its executors stay
        spark.stop()
        return
    if getattr(spark, REUSED, False) or getattr(spark.sparkContext, REUSED, False):
        return
    sc = spark.sparkContext
    server = getattr(sc, "_accumulatorServer", None)
    if server is not None:
        server.server_shutdown = True  # the handler's loop ends at its next poll
        sc._accumulatorServer = None  # so stop() does not wait for it
    spark.stop()


class ContextSession:
    """What a job that needs only RDDs gets instead of a SparkSession: its SparkContext (``sparkContext``), ``read``
    (a SparkSession over that context, made on first use) and ``stop``. The SparkContext alone starts in 0.75-0.82 s
    on 2 cores where SparkSession.builder took 1.39-1.53 s (its JVM side loads the SQL engine)."""

    def __init__(self, sc: Any) -> None:
        self.sparkContext = sc
        self._session: Any = None

    @property
    def read(self) -> Any:
        if self._session is None:
            from pyspark.sql import SparkSession

            self._session = SparkSession.builder.getOrCreate()  # over the running context
        return self._session.read

    def stop(self) -> None:
        self.sparkContext.stop()


def build_context(app_name: str) -> Any:
    """The job's SparkContext (as ContextSession); the master and resources come from spark-submit, never from here.
    In the reused local driver (driver_server) the server's running context; through Spark Connect ($SPARK_REMOTE)
    a Connect session (jobs run their partitions through imgest.spark.partitions, which takes either)."""
    if os.environ.get(REMOTE_ENV):
        return connect_session(os.environ[REMOTE_ENV], app_name)
    from pyspark import SparkConf, SparkContext

    conf = SparkConf().setAppName(app_name).set("spark.ui.showConsoleProgress", "false")
    sc = SparkContext.getOrCreate(conf)
    sc.setLogLevel("WARN")
    return ContextSession(sc)


def job_path(name: str) -> Path:
    """Path of jobs/NAME.py."""
    path = jobs_dir() / f"{name}.py"
    if not path.is_file():
        raise ImgestError(f"Spark job {path} not found")
    return path


def package_zip() -> Path:
    """imgest (with sql/) zipped for --py-files, so executors elsewhere import the submitted code.

    From a checkout the zip holds imgest/ plus the top-level sql/ as imgest/sql; a wheel already holds both.
    """
    out = state_dir() / "spark" / "imgest-pyfiles.zip"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    files = {
        Path("imgest") / path.relative_to(PACKAGE_DIR): path
        for path in PACKAGE_DIR.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    for path in sql_dir().glob("*.cql"):
        files.setdefault(Path("imgest") / "sql" / path.name, path)
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, path in sorted(files.items()):
            zf.write(path, name)
    tmp.replace(out)  # concurrent submissions never ship a half-written zip
    return out


def submit_command(
    job: str, job_args: list[str], master: str = LOCAL_MASTER, conf: dict[str, str] | None = None
) -> list[str]:
    """The spark-submit argv for jobs/JOB.py (pure apart from building the --py-files zip for clusters). For a Spark
    Connect MASTER (``sc://host:port``) the job itself, run by this Python as the session's thin client (no
    spark-submit, no JVM); its settings are the server's (CONF is refused: a Connect session cannot set them)."""
    if is_connect(master):
        return connect_command(job, job_args, master, conf)
    from imgest.spark.distribution import spark_submit

    cmd = [spark_submit(), "--master", with_task_retries(master), "--name", f"imgest-{job}"]
    for key, value in spark_conf(conf, master).items():
        cmd += ["--conf", f"{key}={value}"]
    if needs_shipping(master):
        cmd += ["--py-files", str(package_zip())]
    return [*cmd, str(job_path(job)), *job_args]


def connect_command(job: str, job_args: list[str], master: str, conf: dict[str, str] | None = None) -> list[str]:
    """The argv of jobs/JOB.py through Spark Connect at MASTER. ConfigError for a token inside MASTER (it would show
    on the command line and in logs: SPARK_CONNECT_AUTHENTICATE_TOKEN carries it) or Spark settings in CONF."""
    from imgest.core.errors import ConfigError

    if "token=" in master.lower():
        raise ConfigError(
            f"the Spark Connect URL {master.split(';', 1)[0]};... carries a token: give it as the Spark connection's "
            "password or SPARK_CONNECT_AUTHENTICATE_TOKEN, never in the URL (command lines and logs show it)"
        )
    if conf:
        raise ConfigError(
            f"Spark settings {sorted(conf)} cannot be set for a Spark Connect session: set them on the server "
            f"({master})"
        )
    return [sys.executable, "-m", "imgest.spark.thin_client", str(job_path(job)), REMOTE_OPTION, master, *job_args]


def run_submit(cmd: list[str], log_file: Path | None = None, reuse: bool = True) -> int:
    """Run spark-submit; returns its exit code. REUSE=False never hands the job to a reused driver (benchmarks
    that measure spark-submit's processes).

    Without LOG_FILE its output streams through. With LOG_FILE everything goes to that file and only the job's
    own lines (stdout, imgest's log lines) reach the console: Spark's and Java's traces stay in the file. The
    driver learns the dataset locks this process holds (it fences its publishing with them).
    """
    from imgest.core.locks import holder_env

    held = holder_env()
    connect = REMOTE_OPTION in cmd[:6]
    if log_file is not None and reuse and not connect:
        from imgest.spark import driver_server

        rc = driver_server.submit(cmd, log_file, held)
        if rc is not None:  # ran in the reused local driver ($IMGEST_SPARK_DRIVER_SOCKET, the test suite's)
            with open(log_file) as done:
                for line in done:
                    if _job_line(line):
                        sys.stdout.write(line)
            sys.stdout.flush()
            return rc
    log.info("running %s", " ".join([*cmd[:4], "...", cmd[-1]]))
    master = cmd[cmd.index("--master") + 1] if "--master" in cmd else LOCAL_MASTER
    env = {**(dict(os.environ) if connect else submit_env(master)), **held}
    if log_file is None:
        return subprocess.run(cmd, env=env, check=False).returncode
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout or ():
            out.write(line)
            if _job_line(line):
                sys.stdout.write(line)
                sys.stdout.flush()
        return proc.wait()


def _job_line(line: str) -> bool:
    """True for lines a user should see while a job runs: imgest's log lines and the job's JSON summary."""
    return (" imgest." in line and " ERROR " not in line) or line.startswith(("{", "}", '  "'))


LOCAL = re.compile(r"^local(?:\[(\*|\d+)\])?$")


def with_task_retries(master: str) -> str:
    """local, local[N] and local[*] become local[N,F]: a crashed task is retried up to F times, as on a cluster.

    Any other master (local[N,F] included) is returned unchanged.
    """
    match = LOCAL.match(master)
    return f"local[{match.group(1) or 1},{TASK_MAX_FAILURES}]" if match else master


def job_logging(*noisy: str) -> None:
    """A job driver's log format, the NOISY loggers (boto3's, py4j's) at warnings only."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in noisy:
        logging.getLogger(name).setLevel(logging.WARNING)


def emit_summary(summary: dict[str, Any], path: Path | None) -> None:
    """Print a job's JSON summary (the driver log) and write it to PATH when given."""
    import json

    print(json.dumps(summary, indent=2), flush=True)
    if path:
        path.write_text(json.dumps(summary, indent=2) + "\n")
