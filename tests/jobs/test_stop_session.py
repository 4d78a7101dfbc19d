"""stop_session: a job's session ends as spark.stop() ends it, without PySpark's wait for its accumulator server
(its ``shutdown()``, which a plain ``spark.stop()`` calls, is never called); the reused driver's session is left
running."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import sys
    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    from imgest.spark.driver_server import REUSED
    from imgest.spark.submit import stop_session

    spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    sc = spark.sparkContext
    acc = sc.accumulator(0)
    sc.parallelize(range(10), 2).foreach(lambda x: acc.add(x))
    assert acc.value == 45, acc.value  # the server took the tasks' updates
    server = sc._accumulatorServer
    waited = []
    shutdown = server.shutdown
    server.shutdown = lambda: (waited.append("shutdown"), shutdown())  # spark.stop()'s wait of up to a second
    if sys.argv[1] == "reused":
        setattr(spark, REUSED, True)
        stop_session(spark)
        assert SparkContext._active_spark_context is sc and sc._accumulatorServer is server
        assert sc.parallelize(range(3)).count() == 3  # still serving jobs
        print("kept")
    else:
        stop_session(spark)
        assert SparkContext._active_spark_context is None and sc._jsc is None
        assert server.server_shutdown and sc._accumulatorServer is None  # its handler leaves at its next poll
        assert waited == [], waited  # a plain spark.stop() waits in shutdown(): this one did not
        print("stopped")
    """
)


@pytest.mark.slow  # starts a Spark JVM
@pytest.mark.parametrize("kind", ["job", "reused"])
def test_stop_session(kind: str) -> None:
    import os

    from imgest.spark.distribution import python_path

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(python_path())}  # Spark's PySpark, not pyspark-client's
    run = subprocess.run([sys.executable, "-c", SCRIPT, kind], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == ("kept" if kind == "reused" else "stopped")
