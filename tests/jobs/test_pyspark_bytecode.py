"""On this project's install, a job's driver and its local workers import PySpark from the bytecode of the Spark
`imgest spark install` put beside the environment, not from the source zip spark-submit puts first on their path
(imgest.spark.pypath) nor from the environment's pyspark-client files, and the workers' daemon is imgest's
(spark.python.daemon.module)."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from imgest.spark import pypath
from imgest.spark.conf import spark_conf, submit_env

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from imgest.spark.pypath import prefer_installed_pyspark

    zips = [p for p in sys.path if p.endswith(".zip")]
    dropped = prefer_installed_pyspark()
    from pyspark import SparkContext

    def where(_):
        import pyspark
        main = sys.modules["__main__"].__spec__
        return [{"pyspark": pyspark.__file__, "daemon": main.name if main else None,
                 "zips": [p for p in sys.path if p.endswith("pyspark.zip")]}]

    sc = SparkContext.getOrCreate()
    workers = sc.parallelize(range(2), 2).mapPartitions(where).collect()
    import pyspark
    print(json.dumps({"zips": zips, "dropped": dropped, "driver": pyspark.__file__, "workers": workers}))
    sc.stop()
    """
)


@pytest.mark.slow  # spark-submit: a Spark JVM and its Python workers
def test_driver_and_workers_import_the_installed_package(tmp_path: Path) -> None:
    from imgest.spark.distribution import spark_home, spark_submit

    home = spark_home()
    assert home is not None
    assert (home.parent / pypath.READY).is_file(), f"{home} is not imgest's Spark install"
    record = json.loads(pypath.record_path(home).read_text())  # `imgest spark install` wrote it
    assert record["same"], f"the install found pyspark's files differ from its zip: {record['differing']}"
    script = tmp_path / "where.py"
    script.write_text(SCRIPT)
    cmd = [spark_submit(), "--master", "local[2]"]
    for key, value in spark_conf(master="local[2]").items():
        cmd += ["--conf", f"{key}={value}"]
    run = subprocess.run(
        [*cmd, str(script)], env=submit_env("local[2]"), capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    package = str(Path(record["package"]))
    assert any(z.endswith("pyspark.zip") for z in out["zips"])  # spark-submit did put the zip first
    assert any(d.endswith("pyspark.zip") for d in out["dropped"])
    assert out["driver"].startswith(package + "/")
    assert len(out["workers"]) == 2
    for worker in out["workers"]:
        assert worker["pyspark"].startswith(package + "/")
        assert worker["zips"] == []
        assert worker["daemon"] == pypath.DAEMON_MODULE
