"""Airflow as it is deployed, on one machine: ``imgest services up airflow-celery``.

PostgreSQL for the metadata database and Redis as the Celery broker (``imgest.services.metadb``), the API
server, the scheduler, the DAG processor, the triggerer, and two Celery workers that share nothing but the
stores: each has its own ``IMGEST_HOME`` (its own empty disk) and its own host name (a UTS namespace: the task
instances record ``worker-a`` / ``worker-b``), and the run state goes through ``$IMGEST_STATE_URL``
(``s3://imgest/_airflow-celery`` unless set), so a task finds what a task on the other worker wrote. Every Spark
submitting task runs in the ``spark`` pool (one slot per Spark job the connection's master can run at once: 1 on
a 2-core local master), so three datasets triggered together queue instead of oversubscribing the machine.

``airflow standalone`` (``imgest services up airflow``, SQLite) stays for the demo; this home is
``$IMGEST_HOME/airflow-celery`` with the UI on ``IMGEST_AIRFLOW_CELERY_PORT`` (8082).
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from imgest.core.paths import dags_dir, state_dir
from imgest.core.settings import env_int
from imgest.services.airflow import AIRFLOW_CFG, PREPARED, AirflowServer
from imgest.services.base import ServiceStatus, UpResult
from imgest.services.cassandra import CassandraServer
from imgest.services.metadb import PostgresServer, RedisServer
from imgest.services.process import ManagedProcess, require_free_port, stop_all
from imgest.services.s3 import S3Server

WORKERS = ("worker-a", "worker-b")
SHARED_ON_THIS_MACHINE = (tempfile.gettempdir(), "/data", "/mnt", "/srv", "/home")
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
CELERY_CFG = """
[celery]
broker_url = {broker}
result_backend = db+{result}
worker_concurrency = 2

[celery_broker_transport_options]
# Longer than a task may run (execution_timeout 12 h): an unacknowledged task is redelivered after it.
visibility_timeout = 50400
"""


@dataclass(frozen=True)
class CeleryAirflow(AirflowServer):
    """Airflow with the CeleryExecutor, PostgreSQL, Redis and two workers of their own homes."""

    pg_port: int = 5433
    redis_port: int = 6380
    name: str = "airflow-celery"

    @classmethod
    def default(cls) -> CeleryAirflow:  # type: ignore[override]
        return cls(
            home=state_dir() / "airflow-celery",
            port=env_int("IMGEST_AIRFLOW_CELERY_PORT", 8082),
            pg_port=env_int("IMGEST_POSTGRES_PORT", 5433),
            redis_port=env_int("IMGEST_REDIS_PORT", 6380),
        )

    def _passwords(self) -> dict[str, str]:
        path = self.home / "backends.json"
        if path.is_file():
            return json.loads(path.read_text())
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        data = {"postgres": secrets.token_urlsafe(24), "redis": secrets.token_urlsafe(24)}
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh)
        return data

    @property
    def postgres(self) -> PostgresServer:
        return PostgresServer(self.home, self.pg_port, self._passwords()["postgres"])

    @property
    def redis(self) -> RedisServer:
        return RedisServer(self.home, self.redis_port, self._passwords()["redis"])

    def state_url(self) -> str:
        return os.environ.get("IMGEST_STATE_URL") or "s3://imgest/_airflow-celery"

    @property
    def worker_home(self) -> Path:
        """IMGEST_HOME of every worker: one path, a different folder behind it in each worker's mount namespace
        (as pods mount an empty disk at the same path)."""
        return self.home / "imgest-home"

    def env(self, worker: str | None = None) -> dict[str, str]:  # type: ignore[override]
        """Any airflow command's environment; a WORKER's IMGEST_HOME is its own disk (worker_home)."""
        env = super().env()
        env.pop("IMGEST_SPARK_DRIVER_SOCKET", None)  # a test suite's reused driver is not on the workers' hosts
        env["IMGEST_STATE_URL"] = self.state_url()
        # A task whose worker is lost is failed (then retried elsewhere) after a minute without heartbeat, not 5.
        env.setdefault("AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT", "60")
        env.setdefault("AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL", "5")
        # A restarted scheduler adopts the tasks a dead one queued (only then it may fail them) every 30 s, not 5 min.
        env.setdefault("AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL", "30")
        env.setdefault("IMGEST_DATASETS_FILE", str(state_dir() / "datasets.toml"))  # the DAG files' config map
        # One machine: its folders are the same for both workers and the local Spark master, except each worker's
        # IMGEST_HOME; local sources and files targets there are allowed (the hosts deployment has none).
        env.setdefault("IMGEST_SHARED_MOUNTS", ",".join(SHARED_ON_THIS_MACHINE))
        if worker:
            env["IMGEST_HOME"] = str(self.worker_home)
        return env

    def write_config(self) -> Path:
        """airflow.cfg: the CeleryExecutor, PostgreSQL, Redis, this home's API port and secrets."""
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        text = AIRFLOW_CFG.format(home=self.home, dags=dags_dir(), host=self.host, port=self.port, **self.secrets())
        sqlite = f"sql_alchemy_conn = sqlite:///{self.home}/airflow.db"
        text = text.replace(sqlite, f"sql_alchemy_conn = {self.postgres.url}")
        text = text.replace(
            "load_examples = False\n",
            "load_examples = False\nexecutor = CeleryExecutor\nhostname_callable = socket.gethostname\n"
            f"execution_api_server_url = http://{self.host}:{self.port}/execution/\n",
        )
        result = self.postgres.url.replace("postgresql+psycopg2", "postgresql")
        text += CELERY_CFG.format(broker=self.redis.url, result=result)
        path = self.home / "airflow.cfg"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        return path

    def db_exists(self) -> bool:
        """The PostgreSQL database was migrated (the stamp is written after that)."""
        return (self.home / PREPARED).is_file()

    def process_of(self, component: str) -> ManagedProcess:
        return ManagedProcess(f"airflow-{component}", self.home / f"{component}.pid", self.home / f"{component}.log")

    def command(self, component: str) -> list[str]:
        airflow = str(Path(sys.executable).parent / "airflow")
        if component in WORKERS:
            worker = [airflow, "celery", "worker", "--celery-hostname", f"{component}@%h", "--concurrency", "2"]
            namespaces = ["unshare", "--uts", "--mount", "--propagation", "private"]
            return [*namespaces, "sh", "-c", self._host(component), "sh", *worker]
        return [airflow, component, *(["--port", str(self.port)] if component == "api-server" else [])]

    def _host(self, worker: str) -> str:
        """Shell that makes this process a host of its own: host name WORKER (resolvable: its /etc/hosts names
        it), and its own disk behind worker_home; then runs its arguments."""
        own = self.home / worker
        (own / "imgest-home").mkdir(parents=True, exist_ok=True)
        self.worker_home.mkdir(parents=True, exist_ok=True)
        hosts = own / "hosts"
        hosts.write_text(Path("/etc/hosts").read_text() + f"\n127.0.1.1 {worker}\n")
        q = shlex.quote
        return (
            f"hostname {worker} && mount --bind {q(str(hosts))} /etc/hosts && "
            f'mount --bind {q(str(own / "imgest-home"))} {q(str(self.worker_home))} && exec "$@"'
        )

    def up(self, timeout: float = 240.0) -> UpResult:  # type: ignore[override]
        """PostgreSQL, Redis, the migrated database with imgest's connections and pools, then every component."""
        if all(self.process_of(c).pid() for c in (*COMPONENTS, *WORKERS)) and self.answers():
            return UpResult(self.name, False, 0.0, f"airflow (Celery) already running at {self.url}")
        if self.process_of("api-server").pid() is None:
            require_free_port(self.name, self.host, self.port, "IMGEST_AIRFLOW_CELERY_PORT")
        waited = self.postgres.up() + self.redis.up()  # each starts only if it is not running
        self.prepare(CassandraServer.default(), S3Server.default())  # migrates, connections, the spark pool
        for component in (*COMPONENTS, *WORKERS):
            if self.process_of(component).pid() is None:
                env = self.env(component if component in WORKERS else None)
                self.process_of(component).start(self.command(component), env=env, cwd=self.home)
        waited += self.process_of("api-server").wait_ready(self.answers, timeout, f"HTTP on {self.url}")
        self.warm_execution_api()
        self.tighten()
        return UpResult(
            self.name,
            True,
            waited,
            f"airflow (CeleryExecutor, PostgreSQL :{self.pg_port}, Redis :{self.redis_port}, workers "
            f"{', '.join(WORKERS)}) at {self.url} after {waited:.1f}s; login {self.login()}; state "
            f"{self.state_url()}; AIRFLOW_HOME={self.home}",
        )

    def down(self) -> bool:  # type: ignore[override]
        stopped = stop_all([self.process_of(c) for c in (*WORKERS, *COMPONENTS)], timeout=60)
        return any([*stopped, self.redis.down(), self.postgres.down()])

    def status(self) -> ServiceStatus:  # type: ignore[override]
        parts = {c: self.process_of(c).pid() for c in (*COMPONENTS, *WORKERS)}
        parts |= {"postgres": self.postgres.process.pid(), "redis": self.redis.process.pid()}
        detail = " ".join(f"{c}={pid or 'down'}" for c, pid in parts.items())
        return ServiceStatus(self.name, self.url, parts["api-server"], self.answers(), detail)
