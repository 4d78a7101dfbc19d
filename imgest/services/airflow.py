"""Embedded Airflow: AIRFLOW_HOME in the state folder, SQLite metadata DB, imgest's connections."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import secrets
import sqlite3
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from imgest.core.defaults import LOCAL_MASTER
from imgest.core.errors import ServiceError
from imgest.core.paths import dags_dir, private, state_dir
from imgest.core.settings import EMBEDDED_HOST, env_int
from imgest.services import airflow_cli
from imgest.services.base import ServiceStatus, UpResult
from imgest.services.cassandra import CassandraServer
from imgest.services.process import ManagedProcess, port_open, require_free_port
from imgest.services.s3 import S3Server

log = logging.getLogger(__name__)
PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"  # written by `airflow standalone`
PREPARED = "prepared.json"  # the Airflow version, a digest of the connections and the pools the DB was prepared with
# SQLite's busy wait: 60 s, not pysqlite's 5 (four processes write the DB at `airflow standalone`'s start). Only for the
# SQLite home: the PostgreSQL deployment (airflow_celery) reuses AIRFLOW_CFG, and psycopg2 has no "timeout".
SQLITE_WAIT = (
    "sql_alchemy_connect_args = imgest.services.airflow_sqlite.CONNECT_ARGS\n"
    "sql_alchemy_connect_args_async = imgest.services.airflow_sqlite.ASYNC_CONNECT_ARGS\n"
)
SCHEDULER_START_S = 120.0  # how long `up` waits for the scheduler's first beat once the API answers
SCHEDULER_STALE_S = 60  # a running standalone whose scheduler has not beaten for this long is restarted
SPARK_POOL = "spark"  # every Spark submitting task runs in it: one slot per Spark job the connection's master can run


def spark_slots() -> int:
    """Slots of the `spark` pool: $IMGEST_SPARK_POOL_SLOTS, else one per 4 cores (at least 1: one job at a time
    on a 2-core local master, whose job already uses every core)."""
    return env_int("IMGEST_SPARK_POOL_SLOTS", max(1, (os.cpu_count() or 2) // 4))


AIRFLOW_CFG = """\
# Written by imgest (imgest/services/airflow.py). Only AIRFLOW_HOME={home} is needed to use it.
[core]
dags_folder = {dags}
fernet_key = {fernet_key}
load_examples = False
dags_are_paused_at_creation = False
parallelism = 4
max_active_tasks_per_dag = 2

[database]
sql_alchemy_conn = sqlite:///{home}/airflow.db

[logging]
base_log_folder = {home}/logs

[api]
host = {host}
port = {port}
base_url = http://{host}:{port}
secret_key = {secret_key}

[dag_processor]
refresh_interval = 30

[scheduler]
# Also how soon an Asset emitted through an AssetAlias is marked active and so listed in the Assets view.
parsing_cleanup_interval = 10

[api_auth]
jwt_secret = {jwt_secret}
"""


@dataclass(frozen=True)
class AirflowServer:
    """The local Airflow installation; `up` runs `airflow standalone` (UI, scheduler, workers)."""

    home: Path
    port: int = 8080
    host: str = EMBEDDED_HOST
    name: str = "airflow"

    @classmethod
    def default(cls) -> AirflowServer:
        return cls(home=state_dir() / "airflow", port=env_int("IMGEST_AIRFLOW_PORT", 8080))

    @property
    def process(self) -> ManagedProcess:
        return ManagedProcess(self.name, self.home / "standalone.pid", self.home / "standalone.log")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def env(self) -> dict[str, str]:
        """Environment for any airflow command: AIRFLOW_HOME, and the venv's bin first on PATH."""
        env = dict(os.environ)
        bin_dir = str(Path(sys.executable).parent)
        env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
        env["AIRFLOW_HOME"] = str(self.home)
        env.setdefault("IMGEST_SPARK_POOL", SPARK_POOL)  # created with the connections (prepare)
        env.setdefault("IMGEST_HOME", str(state_dir()))
        from imgest.services.embedded import use_embedded

        use_embedded(env)  # this Airflow is embedded: its tasks reach the embedded stores, as `services env` says
        return env

    def airflow(self, *args: str, check: bool = True, capture: bool = True) -> subprocess.CompletedProcess[str]:
        """Run the `airflow` CLI with this home; a failure raises ServiceError with its last output. Under the
        test suite the command runs in a warm process that has imported Airflow already (airflow_cli)."""
        env = self.env()
        proc = airflow_cli.run(list(args), env, capture)
        if proc is None:
            cmd = [str(Path(sys.executable).parent / "airflow"), *args]
            proc = subprocess.run(cmd, env=env, text=True, capture_output=capture, check=False, umask=0o077)
        if check and proc.returncode != 0:
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-5:]
            raise ServiceError(f"airflow {' '.join(args)} failed (exit {proc.returncode}): " + " | ".join(tail))
        return proc

    def write_config(self) -> Path:
        """Write airflow.cfg pointing at the repo's dags/ and the SQLite DB in this home."""
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.home / "airflow.cfg"
        text = AIRFLOW_CFG.format(home=self.home, dags=dags_dir(), host=self.host, port=self.port, **self.secrets())
        conn = f"sql_alchemy_conn = sqlite:///{self.home}/airflow.db\n"
        text = text.replace(conn, conn + SQLITE_WAIT)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        return path

    def secrets(self) -> dict[str, str]:
        """Secrets every Airflow component must share (JWT signing, sessions, the Fernet key that encrypts
        connection passwords in airflow.db), generated once per home; a missing one is added."""
        from cryptography.fernet import Fernet

        path = self.home / "secrets.json"
        data = json.loads(path.read_text()) if path.is_file() else {}
        wanted = {
            "jwt_secret": lambda: secrets.token_urlsafe(32),
            "secret_key": lambda: secrets.token_urlsafe(32),
            "fernet_key": lambda: Fernet.generate_key().decode(),
        }
        if set(wanted) - set(data):
            data = {name: data.get(name) or make() for name, make in wanted.items()}
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh)
        return data

    def tighten(self) -> None:
        """This home and the files that hold secrets readable by their owner only (0700 / 0600)."""
        private(self.home)
        for name in ("airflow.db", "airflow.cfg", "secrets.json", "standalone.log", PASSWORDS_FILE, PREPARED):
            private(self.home / name)

    def connections(self, cassandra: CassandraServer, s3: S3Server) -> dict[str, dict[str, object]]:
        """The connections imgest's DAGs use, pointing at the embedded services."""
        key, secret = s3.credentials()
        return {
            "cassandra_default": {
                "conn_type": "cassandra",
                "host": cassandra.host,
                "port": cassandra.native_port,
                "extra": json.dumps({"protocol_version": 5}),
            },
            "aws_default": {
                "conn_type": "aws",
                "login": key,
                "password": secret,
                "extra": json.dumps({"endpoint_url": s3.endpoint, "region_name": "us-east-1"}),
            },
            "spark_default": {
                "conn_type": "spark",
                "host": LOCAL_MASTER,
                "extra": json.dumps({"deploy-mode": "client", "spark-binary": "spark-submit"}),
            },
        }

    def prepare(self, cassandra: CassandraServer, s3: S3Server) -> float:
        """Config, `airflow db migrate`, and the connections; returns seconds taken. A home already prepared by
        this Airflow version with the same connections (PREPARED names both) only gets its config rewritten:
        each `airflow` command costs seconds of CPU."""
        t0 = time.monotonic()
        self.write_config()
        connections = self.connections(cassandra, s3)
        stamp = {
            "airflow": importlib.metadata.version("apache-airflow"),
            "connections": hashlib.sha256(json.dumps(connections, sort_keys=True).encode()).hexdigest(),
            "pools": {SPARK_POOL: spark_slots()},
        }
        stamp_file = self.home / PREPARED
        prepared = stamp_file.is_file() and json.loads(stamp_file.read_text()) == stamp
        if prepared and self.db_exists():
            self.tighten()
            return time.monotonic() - t0
        stamp_file.unlink(missing_ok=True)
        self.airflow("db", "migrate")
        conn_file = self.home / "connections.json"
        fd = os.open(conn_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(connections, fh)
        try:
            self.airflow("connections", "import", "--overwrite", str(conn_file))  # encrypted with the Fernet key
        finally:
            conn_file.unlink(missing_ok=True)
        self.airflow("pools", "set", SPARK_POOL, str(spark_slots()), "imgest Spark jobs: one slot per job at once")
        stamp_file.write_text(json.dumps(stamp))
        self.tighten()
        return time.monotonic() - t0

    def db_exists(self) -> bool:
        """Whether the metadata database was created (SQLite: its file)."""
        return (self.home / "airflow.db").is_file()

    def answers(self) -> bool:
        """True when the API server's health endpoint answers."""
        if not port_open(self.host, self.port):
            return False
        try:
            with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=3) as resp:
                return resp.status == 200
        except OSError:
            return False

    def warm_execution_api(self, timeout: float = 120.0) -> float:
        """Ask the task execution API once: the API server builds it at its first request (6 s on two idle cores),
        and a task that meets that first request times out and retries (14 s for the first task of the first run)."""
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(f"{self.url}/execution/health", timeout=timeout) as resp:
                resp.read()
        except OSError as exc:  # the tasks will build it then; nothing depends on this call
            log.warning("airflow execution API did not answer %s/execution/health: %s", self.url, exc)
        return time.monotonic() - t0

    def login(self) -> str:
        """'admin / PASSWORD' from the file `airflow standalone` generates, when it exists."""
        path = self.home / PASSWORDS_FILE
        try:
            users = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return f"see {self.process.log_file}"
        return ", ".join(f"{user} / {pw}" for user, pw in users.items())

    def up(self, timeout: float = 240.0) -> UpResult:
        """Prepare the home (DB, connections) and run `airflow standalone` until its API answers and its scheduler
        beats. A standalone whose scheduler died (it keeps serving the UI; CI once saw the scheduler's first write
        fail on a locked SQLite DB) is restarted once, then named in the error."""
        if self.process.pid() is not None and self.answers():
            if self.scheduler_beats(SCHEDULER_STALE_S):
                return UpResult(self.name, False, 0.0, f"airflow already running at {self.url} (login {self.login()})")
            log.warning("airflow's scheduler has not beaten for %d s: restarting airflow standalone", SCHEDULER_STALE_S)
            self.restart_down()
        waited = 0.0
        for attempt in (1, 2):
            started = time.time()
            if self.process.pid() is None:
                require_free_port(self.name, self.host, self.port, "IMGEST_AIRFLOW_PORT")
                prep = self.prepare(CassandraServer.default(), S3Server.default())
                log.info("airflow home prepared in %.1fs", prep)
                self.process.start(
                    [str(Path(sys.executable).parent / "airflow"), "standalone"], env=self.env(), cwd=self.home
                )
            waited += self.process.wait_ready(self.answers, timeout, f"HTTP on {self.url}")
            try:
                waited += self.process.wait_ready(
                    lambda t=started: self.scheduler_beats(time.time() - t + 1), SCHEDULER_START_S, "a scheduler beat"
                )
                break
            except ServiceError:
                if attempt == 2:
                    raise
                log.warning(
                    "airflow's scheduler did not start (log %s): restarting airflow standalone once",
                    self.process.log_file,
                )
                self.restart_down()
        self.warm_execution_api()
        self.tighten()
        return UpResult(
            self.name,
            True,
            waited,
            f"airflow UI at {self.url} after {waited:.1f}s; login {self.login()}; AIRFLOW_HOME={self.home}",
        )

    def scheduler_beats(self, within: float) -> bool:
        """Whether a running SchedulerJob in the metadata DB has beaten within the last WITHIN seconds."""
        try:
            db = sqlite3.connect((self.home / "airflow.db").as_uri() + "?mode=ro", uri=True, timeout=5)
            try:
                row = db.execute(
                    "SELECT max(latest_heartbeat) FROM job WHERE job_type = 'SchedulerJob' AND state = 'running'"
                ).fetchone()
            finally:
                db.close()
        except sqlite3.Error:
            return False
        if not row or not row[0]:
            return False
        beat = datetime.fromisoformat(str(row[0]))
        beat = beat if beat.tzinfo else beat.replace(tzinfo=UTC)
        return (datetime.now(UTC) - beat).total_seconds() <= within

    def down(self) -> bool:
        return self.process.stop(timeout=60)

    def restart_down(self, timeout: float = 60.0) -> None:
        """Stop standalone for a restart and wait for its port: standalone's leader exits on SIGTERM before its
        children, and the API server may still hold the port for a moment."""
        self.down()
        deadline = time.monotonic() + timeout
        while port_open(self.host, self.port) and time.monotonic() < deadline:
            time.sleep(0.25)

    def status(self) -> ServiceStatus:
        return ServiceStatus(self.name, self.url, self.process.pid(), self.answers(), f"AIRFLOW_HOME={self.home}")
