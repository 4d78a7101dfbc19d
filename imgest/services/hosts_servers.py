"""The embedded servers, each started inside a simulated host (imgest.services.hosts_net) instead of beside the
caller: the same classes, whose processes run behind the host's prefix (``ip netns exec ... unshare ... sh -c``)
with the host's whole environment. Their readiness checks probe the host's address from the root namespace,
through the bridge.

A process started this way keeps its PID through the prefix (each step execs the next), so PID files, logs and
``stop`` work as for any ManagedProcess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from imgest.core.errors import ServiceError
from imgest.core.paths import conf_file
from imgest.services.airflow import SPARK_POOL, spark_slots
from imgest.services.airflow_celery import CeleryAirflow
from imgest.services.cassandra import CassandraServer
from imgest.services.metadb import PostgresServer, RedisServer, pg_mountpoint
from imgest.services.process import ManagedProcess
from imgest.services.spark_cluster import WORKER_CLASS, SparkCluster, clean_env, spark_home
from imgest.services.spark_connect import SparkConnectServer

CELERY_WORKER = "celery-worker"


@dataclass(frozen=True)
class HostProcess(ManagedProcess):
    """A ManagedProcess whose command runs behind PREFIX (a host's), with ENVIRON when the caller passes none."""

    prefix: tuple[str, ...] = ()
    environ: dict[str, str] = field(default_factory=dict, compare=False)

    def start(self, argv: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> int:
        """Start ARGV inside the host; returns the PID (that of ARGV itself once the prefix has exec'd it)."""
        return super().start([*self.prefix, *argv], env=dict(self.environ) if env is None else env, cwd=cwd)


@dataclass(frozen=True, kw_only=True)
class InHost:
    """A server's fields for running in a host: the host's command prefix and its environment."""

    prefix: tuple[str, ...] = ()
    environ: dict[str, str] = field(default_factory=dict, compare=False)

    def moved(self, proc: ManagedProcess) -> HostProcess:
        """PROC, started inside this host."""
        return HostProcess(proc.name, proc.pid_file, proc.log_file, self.prefix, self.environ)

    def run(self, argv: Sequence[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """Run ARGV to its end inside this host (its output captured)."""
        cmd = [*self.prefix, *argv]
        return subprocess.run(cmd, env=self.environ, text=True, capture_output=True, check=False, timeout=timeout)


@dataclass(frozen=True)
class HostCassandra(CassandraServer, InHost):
    """Cassandra inside a host (its jars bound read-only into the host's state folder)."""

    @property
    def process(self) -> ManagedProcess:
        return self.moved(super().process)


@dataclass(frozen=True)
class HostPostgres(PostgresServer, InHost):
    """PostgreSQL inside a host whose /tmp is HOST_TMP (root view): its mount point is made there."""

    host_tmp: Path = Path("/tmp")
    clients: str = ""  # the network (CIDR) whose hosts may log in with the password, besides loopback

    @property
    def process(self) -> ManagedProcess:
        return self.moved(super().process)

    def _init(self) -> None:
        """As PostgresServer's, then let CLIENTS log in (initdb allows loopback only)."""
        super()._init()
        hba = self.data / "pg_hba.conf"
        line = f"host all airflow {self.clients} scram-sha-256"
        if self.clients and line not in hba.read_text().splitlines():
            with open(hba, "a") as fh:
                fh.write(f"\n# imgest hosts: the other hosts of the deployment\n{line}\n")

    def up(self, timeout: float = 60.0) -> float:
        """As PostgresServer.up, with the data folder's mount point inside the host's /tmp."""
        (self.host_tmp / pg_mountpoint(self.data).name).mkdir(mode=0o755, parents=True, exist_ok=True)
        return super().up(timeout)


@dataclass(frozen=True)
class HostRedis(RedisServer, InHost):
    """Redis inside a host."""

    @property
    def process(self) -> ManagedProcess:
        return self.moved(super().process)


@dataclass(frozen=True)
class HostAirflow(CeleryAirflow, InHost):
    """One host's Airflow: its AIRFLOW_HOME (HOME, root view), the shared config of the deployment (API server on
    HOST:PORT, metadata DB and broker on the store host, secrets kept by the deployer in SECRETS) and its ENVIRON,
    which holds the connections (AIRFLOW_CONN_*)."""

    secrets_home: Path = Path()
    metadb: PostgresServer | None = None
    broker: RedisServer | None = None

    @property
    def postgres(self) -> PostgresServer:
        if self.metadb is None:
            raise ServiceError("hosts: this Airflow host was built without its metadata database")
        return self.metadb

    @property
    def redis(self) -> RedisServer:
        if self.broker is None:
            raise ServiceError("hosts: this Airflow host was built without its broker")
        return self.broker

    def secrets(self) -> dict[str, str]:
        """The deployment's shared secrets (JWT, session, Fernet), kept by the deployer, one set for every host."""
        return CeleryAirflow(home=self.secrets_home).secrets()

    def env(self, worker: str | None = None) -> dict[str, str]:  # type: ignore[override]
        """This host's whole environment (built by the deployment, never the caller's)."""
        return dict(self.environ)

    def process_of(self, component: str) -> ManagedProcess:
        return self.moved(super().process_of(component))

    def command(self, component: str) -> list[str]:
        """COMPONENT's command line; CELERY_WORKER is the Celery worker named after the host it runs on."""
        airflow = str(Path(sys.executable).parent / "airflow")
        if component == CELERY_WORKER:
            return [airflow, "celery", "worker", "--celery-hostname", "%h@%h", "--concurrency", "2"]
        return super().command(component)

    def airflow(self, *args: str, check: bool = True, capture: bool = True) -> subprocess.CompletedProcess[str]:
        """Run the `airflow` CLI inside this host; a failure raises ServiceError with its last output."""
        proc = self.run([str(Path(sys.executable).parent / "airflow"), *args])
        if check and proc.returncode != 0:
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-5:]
            raise ServiceError(f"airflow {' '.join(args)} failed (exit {proc.returncode}): " + " | ".join(tail))
        return proc

    def prepare_db(self) -> None:
        """Migrate the metadata database and create the `spark` pool, once per Airflow version (a stamp beside the
        database says which). Connections are not stored: every process gets them as AIRFLOW_CONN_* variables."""
        import importlib.metadata
        import json

        stamp = {"airflow": importlib.metadata.version("apache-airflow"), "pools": {SPARK_POOL: spark_slots()}}
        stamp_file = self.postgres.home / "prepared.json"
        if stamp_file.is_file() and json.loads(stamp_file.read_text()) == stamp:
            return
        self.airflow("db", "migrate")
        self.airflow("pools", "set", SPARK_POOL, str(spark_slots()), "imgest Spark jobs: one slot per job at once")
        stamp_file.write_text(json.dumps(stamp))


@dataclass(frozen=True)
class HostSparkMaster(SparkCluster, InHost):
    """The standalone master inside a host (its workers are HostSparkWorker, each on a host of its own)."""

    def process(self, index: int = 0) -> ManagedProcess:
        return self.moved(super().process(index))

    def start_master(self) -> None:
        """Start the master unless it runs (no wait)."""
        if self.process().pid() is None:
            base = spark_folder(self.home / "master")
            env = clean_env(base, {"SPARK_LOCAL_IP": self.host, "SPARK_LOCAL_HOSTNAME": self.host})
            self.process().start(self.master_command(), env=env, cwd=base)


@dataclass(frozen=True)
class HostSparkConnect(SparkConnectServer, InHost):
    """The Spark Connect server inside the master's host, on the standalone cluster there (CLUSTER)."""

    @property
    def process(self) -> ManagedProcess:
        return self.moved(super().process)

    def server_env(self) -> dict[str, str]:
        return {**super().server_env(), "SPARK_LOCAL_IP": self.host, "SPARK_LOCAL_HOSTNAME": self.host}


@dataclass(frozen=True)
class HostSparkWorker(InHost):
    """A standalone worker of CORES cores and MEMORY inside a host at ADDRESS, registered with MASTER_URL; its work
    and scratch folders under HOME (root view)."""

    home: Path
    address: str
    master_url: str
    cores: int = 1
    memory: str = "1536m"
    ui_port: int = 8091

    @property
    def process(self) -> ManagedProcess:
        return self.moved(ManagedProcess("spark-worker", self.home / "worker.pid", self.home / "worker.log"))

    def command(self) -> list[str]:
        """The worker's command line (pure): its address, cores, memory, work folder and UI port."""
        return [
            *(str(spark_home() / "bin" / "spark-class"), WORKER_CLASS, self.master_url, "--host", self.address),
            *("--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(self.home / "work")),
            *("--webui-port", str(self.ui_port)),
        ]

    def env(self) -> dict[str, str]:
        """The worker's whole environment (its executors inherit it): clean, bound to its own address."""
        extra = {
            "SPARK_LOCAL_IP": self.address,
            "SPARK_LOCAL_HOSTNAME": self.address,
            "SPARK_LOCAL_DIRS": str(self.home / "scratch"),
            "SPARK_WORKER_DIR": str(self.home / "work"),
            "TMPDIR": self.environ.get("TMPDIR", ""),
        }
        return clean_env(self.home, extra)

    def start(self) -> None:
        """Start the worker unless it runs (no wait: the master's worker list says when it registered)."""
        if self.process.pid() is None:
            spark_folder(self.home)
            for sub in ("work", "scratch"):
                (self.home / sub).mkdir(parents=True, exist_ok=True)
            self.process.start(self.command(), env=self.env(), cwd=self.home)

    @property
    def ui(self) -> str:
        return f"http://{self.address}:{self.ui_port}"


def spark_folder(base: Path) -> Path:
    """BASE with Spark's conf (the repo's log4j2 settings) and logs folders."""
    (base / "conf").mkdir(parents=True, exist_ok=True)
    (base / "logs").mkdir(parents=True, exist_ok=True)
    (base / "conf" / "log4j2.properties").write_text(conf_file("spark-log4j2.properties").read_text())
    return base


def venv_path() -> str:
    """PATH of a host's processes: the virtual environment's bin, then the system's."""
    return os.pathsep.join(
        [str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"]
    )
