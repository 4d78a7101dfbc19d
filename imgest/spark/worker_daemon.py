"""Spark's Python worker daemon (``spark.python.daemon.module``) with PySpark imported from the installed package
where Spark's source zip is a copy of it (imgest.spark.pypath), on local masters (imgest.spark.conf): the daemon
starts 0.5 s sooner on two cores, and the workers it forks inherit the modules. Then PySpark's own daemon runs
unchanged."""

from imgest.spark.pypath import prefer_installed_pyspark

prefer_installed_pyspark()

from pyspark import daemon  # noqa: E402  after the path is settled

if __name__ == "__main__":
    daemon.manager()
