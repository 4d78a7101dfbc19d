"""A Spark Connect server (Spark 4's ``sc://`` endpoint) on the local standalone cluster: the route where imgest's
jobs run with no JVM beside them (the job is the session's thin Python client; imgest.spark.partitions).

The server is a Spark driver of its own (``org.apache.spark.sql.connect.service.SparkConnectServer`` from the
pyspark package's jars, started with its ``spark-submit``) whose executors run on the standalone workers. It gives
executors back when idle (dynamic allocation with shuffle tracking), so spark-submit jobs on the same workers are
not starved by an idle server. Port: ``IMGEST_SPARK_CONNECT_PORT`` (15002).
"""

from __future__ import annotations

import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from imgest.core.errors import ServiceError
from imgest.core.paths import conf_file, state_dir
from imgest.core.settings import EMBEDDED_HOST, env_int
from imgest.services.base import ServiceStatus, UpResult
from imgest.services.process import ManagedProcess, require_free_port
from imgest.services.spark_cluster import SparkCluster, clean_env, spark_home

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
IDLE_TIMEOUT_S = 15  # an executor idle this long is given back to the cluster
# an execution nobody is attached to this long is interrupted: a killed client's, and a deferred job's between its
# client's exit and its trigger's attach ($IMGEST_SPARK_CONNECT_DETACHED_S; docs/cluster.md)
DETACHED_TIMEOUT_S = 30


@dataclass(frozen=True)
class SparkConnectServer:
    """The Connect endpoint sc://HOST:PORT, its driver's folder under HOME, on CLUSTER's workers."""

    home: Path
    cluster: SparkCluster = field(default_factory=SparkCluster.default)
    port: int = 15002
    host: str = EMBEDDED_HOST
    name: str = "spark-connect"

    @classmethod
    def default(cls) -> SparkConnectServer:
        return cls(state_dir() / "spark-connect", port=env_int("IMGEST_SPARK_CONNECT_PORT", 15002))

    @property
    def url(self) -> str:
        """sc://host:port: a job's --master, and the host of a Spark Connect connection."""
        return f"sc://{self.host}:{self.port}"

    @property
    def process(self) -> ManagedProcess:
        return ManagedProcess(self.name, self.home / "server.pid", self.home / "server.log")

    def command(self) -> list[str]:
        """The server's command line (pure): the cluster's master, the executors' Python, idle executors freed."""
        log4j = conf_file("spark-log4j2.properties")
        detached = env_int("IMGEST_SPARK_CONNECT_DETACHED_S", DETACHED_TIMEOUT_S)
        confs = {
            "spark.connect.grpc.binding.address": self.host,
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.pyspark.python": sys.executable,
            "spark.executor.memory": "1g",
            "spark.executor.cores": "1",  # an executor per worker core: dynamic allocation asks for what it needs
            "spark.dynamicAllocation.enabled": "true",
            "spark.dynamicAllocation.shuffleTracking.enabled": "true",
            # an executor holding a finished query's shuffle files is kept until they are cleaned up (never, for a
            # long-lived server): without a timeout an idle server held the cluster's cores and a spark-submit job
            # waited 15 minutes for any
            "spark.dynamicAllocation.shuffleTracking.timeout": f"{IDLE_TIMEOUT_S * 2}s",
            "spark.dynamicAllocation.executorIdleTimeout": f"{IDLE_TIMEOUT_S}s",
            "spark.dynamicAllocation.minExecutors": "0",
            # a job whose client died (a killed Airflow task): its execution is interrupted once it stayed detached
            # this long (default 5 min), not left writing beside the re-run (which is idempotent either way)
            "spark.connect.execute.manager.detachedTimeout": f"{detached}s",
            "spark.connect.execute.manager.maintenanceInterval": "5s",
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={log4j.as_uri()}",
        }
        submit = str(spark_home() / "bin" / "spark-submit")
        cmd = [submit, "--class", SERVER_CLASS, "--name", "Spark Connect server", "--master", self.cluster.master_url]
        for key, value in confs.items():
            cmd += ["--conf", f"{key}={value}"]
        return cmd

    def answers(self) -> bool:
        """True when the server accepts a connection on its port."""
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                return True
        except OSError:
            return False

    def server_env(self) -> dict[str, str]:
        """The server's whole environment: clean, with the Python its executors run for Connect's functions."""
        env = clean_env(self.home, {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"})
        env["SPARK_HOME"] = str(spark_home())
        env["PYSPARK_PYTHON"] = sys.executable  # Connect's Python functions run what the server's environment names
        return env

    def start(self) -> None:
        """Start the server unless it runs (no wait)."""
        if self.process.pid() is None:
            self.home.mkdir(parents=True, exist_ok=True)
            self.process.start(self.command(), env=self.server_env(), cwd=self.home)

    def up(self, timeout: float = 180.0) -> UpResult:
        """Start the standalone cluster when it is not running, then the server; wait until its port answers."""
        if self.answers():
            return UpResult(self.name, False, 0.0, f"spark connect already running at {self.url}")
        self.cluster.up()
        require_free_port(self.name, self.host, self.port, "IMGEST_SPARK_CONNECT_PORT")
        self.start()
        try:
            waited = self.process.wait_ready(self.answers, timeout, f"on {self.url}")
        except BaseException:
            self.process.stop()
            raise
        return UpResult(
            self.name,
            True,
            waited,
            f"spark connect at {self.url} after {waited:.1f}s, executors on {self.cluster.master_url} (freed after "
            f"{IDLE_TIMEOUT_S}s idle); log {self.process.log_file}",
        )

    def down(self, timeout: float = 30.0) -> bool:
        """Stop the server (the cluster stays: `imgest services down spark` stops it); returns once its port no
        longer answers (the JVM below spark-submit's script may outlive the script a moment), so a `up` right after
        starts a new one instead of finding the old one about to go."""
        stopped = self.process.stop()
        deadline = time.monotonic() + timeout
        while self.answers() and time.monotonic() < deadline:
            time.sleep(0.2)
        return stopped

    def status(self) -> ServiceStatus:
        detail = f"master {self.cluster.master_url}"
        return ServiceStatus(self.name, self.url, self.process.pid(), self.answers(), detail)

    def check_running(self) -> None:
        if not self.answers():
            raise ServiceError(f"spark connect at {self.url} is not running; `imgest services up spark-connect`")
