"""A class-data-sharing archive of Spark's driver classes, so each spark-submit starts in a third of the CPU.

Every imgest job is a fresh spark-submit, and on a small machine most of a short job is the JVM loading and
verifying Spark's ~10,000 classes. JDK 13+ can dump the classes one run loaded into an archive
(``-XX:ArchiveClassesAtExit``) that later JVMs map instead of parsing the jars again
(``-XX:SharedArchiveFile``). Measured on 2 cores, a trivial job: 17 -> 10 CPU seconds, 19-28 -> 12 s wall.

The archive is only valid for the exact JVM and class path that wrote it, so its name carries a digest of the
Java release, pyspark's version and Spark's jar list; a JVM that cannot use it (another Java, a changed jar)
runs without it (``-Xshare:auto``, the default). ``python -m imgest.spark.cds`` builds it (the install scripts
do), by running a small job that reads and writes Parquet, shuffles and runs Python tasks, so the archive
holds the classes real jobs load. Without the archive jobs run exactly as before.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from imgest.core import jvmcds
from imgest.core.paths import state_dir
from imgest.spark.conf import archive_path, java_options, spark_conf, submit_env
from imgest.spark.distribution import spark_submit

log = logging.getLogger(__name__)


WARMUP_JOB = """
import sys, pyarrow as pa, pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
out = sys.argv[1]
spark = SparkSession.builder.appName("imgest-cds-warmup").config("spark.ui.showConsoleProgress", "false").getOrCreate()
pq.write_table(pa.table({"id": [str(i) for i in range(200)], "label": list(range(200))}), out + "/in.parquet")
df = spark.read.parquet(out + "/in.parquet").repartition(4)
df = df.withColumn("n", F.length("id")).groupBy("label").agg(F.count("*").alias("c"))
df.write.mode("overwrite").parquet(out + "/out.parquet")
print(spark.sparkContext.parallelize(range(100), 4).mapPartitions(lambda it: [sum(it)]).sum())
print(spark.read.parquet(out + "/out.parquet").toPandas().shape)
spark.stop()
"""


def build_archive(force: bool = False) -> Path | None:
    """Write the archive by running the warm-up job once (about 20-40 s); returns its path (None without pyspark).

    The JVM writes a temporary file that is renamed into place, so concurrent builds and readers never see a
    partial archive.
    """
    path = archive_path()
    if path is None:
        return None
    if path.is_file() and not force:
        return path
    work = state_dir() / "spark" / f"cds-warmup-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    script = work / "warmup.py"
    script.write_text(WARMUP_JOB)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    jvmcds.writer(tmp, os.getpid())  # this process waits for the JVM, then moves the dump into place
    conf = spark_conf(master="local[2]")
    # The archive holds classes, not compiled code: C1 alone (no C2 compiler threads) writes the same archive with
    # a third less CPU (94 -> 62 CPU s, 75 -> 58 s on two cores).
    dump = f" -XX:TieredStopAtLevel=1 -XX:ArchiveClassesAtExit={tmp}"
    conf["spark.driver.extraJavaOptions"] = conf["spark.driver.extraJavaOptions"].replace(java_options(), "") + dump
    cmd = [spark_submit(), "--master", "local[2]"]
    for key, value in conf.items():
        cmd += ["--conf", f"{key}={value}"]
    t0 = time.monotonic()
    env = submit_env("local[2]")
    env["IMGEST_JVM_CDS"] = "0"
    proc = subprocess.run([*cmd, str(script), str(work)], env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        tmp.with_name(tmp.name + ".pid").unlink(missing_ok=True)
        tail = (proc.stdout + proc.stderr)[-2000:]
        log.warning("Spark class-data archive not built (exit %s); jobs run without it:\n%s", proc.returncode, tail)
        return None
    tmp.replace(path)
    tmp.with_name(tmp.name + ".pid").unlink(missing_ok=True)
    jvmcds.adopt(path)  # drops archives of a previous JVM or Spark
    shutil.rmtree(work, ignore_errors=True)
    log.info(
        "Spark class-data archive %s (%.0f MB) built in %.0f s", path, path.stat().st_size / 1e6, time.monotonic() - t0
    )
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m imgest.spark.cds", description="Build the Spark driver's class-data-sharing archive."
    )
    parser.add_argument("--force", action="store_true", help="rebuild even when the archive exists")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    path = build_archive(force=args.force)
    print(f"Spark class-data archive: {path or 'not built (see the warning above)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
