"""What every spark-submit of imgest runs with: the Spark settings, the driver's environment, and the driver's
class-data archive when built (imgest.spark.cds builds it)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from imgest.core import jvmcds
from imgest.core.defaults import LOCAL_MASTER
from imgest.core.paths import conf_file


def spark_home() -> Path | None:
    """Spark's folder (its jars/ holds Spark's class path), or None where there is no Spark
    (imgest.spark.distribution)."""
    from imgest.spark.distribution import spark_home as home

    return home()


def archive_path() -> Path | None:
    """The driver archive for this JVM and Spark (it may not exist yet); None without pyspark."""
    home = spark_home()
    return jvmcds.archive_path("spark-driver", home / "jars") if home else None


def java_options() -> str:
    """The driver JVM option that maps the archive when it exists ('' otherwise)."""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path}" if jvmcds.enabled() and path and jvmcds.adopt(path) else ""


# Spark settings for local masters, where the driver JVM is also the only executor. The repartition of the
# manifest sorts and buffers each map task's rows on the heap before writing the shuffle (about 14 bytes of heap
# per byte of Parquet): with the default splits (the file over the cores: 20 MB each at ImageNet's 1.33 M rows)
# two tasks held 540 MB live and G1 grew the default 1 GiB heap to 1.28 GiB of RSS. Splits of 1 MB keep a map
# task's rows small at any count, and the heap is capped at 512 MB (Spark's minimum is 450 MB): the ingest's
# driver JVM path measured 1,279 -> 675 MiB of peak RSS at 1.33 M rows (issue #24).
LOCAL_DRIVER_CONF: dict[str, str] = {
    "spark.driver.memory": "512m",
    "spark.sql.files.maxPartitionBytes": "1m",
}


# A local driver JVM schedules tasks and carries the Python workers' small results; the rows themselves are read,
# transformed and written by Python (every job in jobs/). C1's code does that as well as C2's, and without C2's
# compiles the JVM spends half the CPU: a 32,000-image bulk ingest measured 6.3 -> 2.9-3.7 CPU seconds of driver
# JVM and 20.5-21.2 -> 19.4-20.2 s on two cores. Set IMGEST_SPARK_JAVA_OPTIONS="-XX:TieredStopAtLevel=4" to undo.
LOCAL_DRIVER_JIT = "-XX:TieredStopAtLevel=1"


# Flat in task count on any master: the live UI store keeps this many finished tasks, stages and jobs (defaults
# 100,000 / 1,000 / 1,000); the event log, when enabled, still records everything.
RETENTION_CONF: dict[str, str] = {
    "spark.ui.retainedTasks": "10000",
    "spark.ui.retainedStages": "100",
    "spark.ui.retainedJobs": "100",
    "spark.sql.ui.retainedExecutions": "100",
}


def spark_conf(conf: dict[str, str] | None = None, master: str = LOCAL_MASTER) -> dict[str, str]:
    """Spark settings every imgest job runs with: this Python for driver and workers, quiet log4j, the driver's
    class-data archive when built (imgest.spark.cds; an executor's class path differs, so it cannot map it),
    $IMGEST_SPARK_JAVA_OPTIONS for driver and executors, a UI store bounded in task count and, on a local
    MASTER, a capped driver heap, small manifest splits and Python workers that import PySpark's bytecode where
    they can (imgest.spark.pypath); on a cluster, the shipped executors' Python when
    $IMGEST_SPARK_PYENV asks for it (imgest.spark.pyenv). CONF wins."""
    from imgest.spark.pyenv import executor_conf
    from imgest.spark.pypath import DAEMON_MODULE

    log4j = f"-Dlog4j2.configurationFile={conf_file('spark-log4j2.properties').as_uri()}"
    extra = os.environ.get("IMGEST_SPARK_JAVA_OPTIONS", "").strip()
    return {
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.driver.extraJavaOptions": " ".join(
            x for x in (log4j, java_options(), LOCAL_DRIVER_JIT if master.startswith("local") else "", extra) if x
        ),
        **({"spark.executor.extraJavaOptions": extra} if extra and not master.startswith("local") else {}),
        **RETENTION_CONF,
        **(LOCAL_DRIVER_CONF if master.startswith("local") else {}),
        # Local workers run this Python, which imports imgest before any task; elsewhere it may come with a task.
        **({"spark.python.daemon.module": DAEMON_MODULE} if master.startswith("local") else {}),
        **(executor_conf() if needs_shipping(master) else {}),  # $IMGEST_SPARK_PYENV: the executors' Python
        **(conf or {}),
    }


def on_loopback(master: str) -> bool:
    """True for local masters and for a standalone master on this machine's loopback address."""
    if master.startswith("local"):
        return True
    host = master.removeprefix("spark://").split(":", 1)[0]
    return master.startswith("spark://") and (host == "localhost" or host.startswith("127."))


def needs_shipping(master: str) -> bool:
    """True when executors run in other processes that must get imgest's code with the submission."""
    return not master.startswith("local")


def submit_env(master: str = LOCAL_MASTER) -> dict[str, str]:
    """Environment for spark-submit (the driver's): Spark's bin/ first on PATH and SPARK_HOME (spark-submit then
    never looks for Spark through a Python whose pyspark is pyspark-client's), the venv's bin next; masters on
    loopback make the driver bind to loopback too."""
    from imgest.spark.distribution import spark_env

    env = dict(os.environ)
    if on_loopback(master):
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return spark_env(env)
