"""PostgreSQL and Redis for the deployed Airflow shape (``imgest services up airflow-celery``), from Debian's
``postgresql`` and ``redis-server`` packages (the install script adds them where missing).

PostgreSQL: a cluster of its own under ``$IMGEST_HOME/airflow-celery/pg`` (``initdb``), TCP on loopback only,
no Unix socket, ``scram-sha-256`` password for the ``airflow`` role (random, in the home's secrets file). As
root, PostgreSQL (which refuses to run as root) runs as the ``postgres`` system user: its data folder is
bind-mounted, in a mount namespace of its own, on a folder that user can reach, so the state folder stays 0700.
Redis: loopback only, a random password from a 0600 config file (never on a command line), no persistence
(Celery's queue lives as long as the deployment).
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from imgest.core.errors import ServiceError
from imgest.services.process import ManagedProcess, port_open, require_free_port

PG_BIN_DIRS = ("/usr/lib/postgresql/17/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/15/bin")
INSTALL_HINT = "install Debian's postgresql and redis-server (scripts/install.sh does as root)"


def pg_bin(program: str) -> str:
    for folder in PG_BIN_DIRS:
        if Path(folder, program).is_file():
            return str(Path(folder, program))
    from shutil import which

    found = which(program)
    if found is None:
        raise ServiceError(f"postgres: {program!r} not found; {INSTALL_HINT}")
    return found


def pg_mountpoint(data: Path) -> Path:
    """The folder under /tmp where a root-started PostgreSQL sees its data folder DATA (see _as_postgres)."""
    return Path("/tmp") / f"imgest-pg-{hashlib.sha256(str(data).encode()).hexdigest()[:12]}"


def _as_postgres(data: Path, argv: list[str]) -> list[str]:
    """ARGV run as the 'postgres' user with DATA reachable at a mount point of its own (root only)."""
    if os.geteuid() != 0:
        return argv
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise ServiceError(f"postgres: running as root needs the 'postgres' system user; {INSTALL_HINT}") from None
    mount = pg_mountpoint(data)
    mount.mkdir(mode=0o755, exist_ok=True)
    inner = [a.replace(str(data), str(mount)) for a in argv]
    script = (
        f"mount --bind {shlex.quote(str(data))} {shlex.quote(str(mount))} && "
        f"exec setpriv --reuid=postgres --regid=postgres --init-groups {shlex.join(inner)}"
    )
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]


@dataclass(frozen=True)
class PostgresServer:
    """A PostgreSQL cluster under HOME/pg for Airflow's metadata, on HOST:PORT."""

    home: Path
    port: int
    password: str
    host: str = "127.0.0.1"
    name: str = "postgres"

    @property
    def data(self) -> Path:
        return self.home / "pg"

    @property
    def process(self) -> ManagedProcess:
        return ManagedProcess(self.name, self.home / "postgres.pid", self.home / "postgres.log")

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://airflow:{self.password}@{self.host}:{self.port}/airflow"

    def answers(self) -> bool:
        """Accepting logins, not only its port open: after a restart it refuses them while it recovers ("the
        database system is starting up")."""
        if not port_open(self.host, self.port):
            return False
        import psycopg2

        try:
            psycopg2.connect(
                host=self.host,
                port=self.port,
                user="airflow",
                password=self.password,
                dbname="postgres",
                connect_timeout=3,
            ).close()
        except psycopg2.OperationalError:
            return False
        return True

    def _init(self) -> None:
        if (self.data / "PG_VERSION").is_file():
            return
        import tempfile

        self.data.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix="imgest-pg-pw-")  # 0600, outside the data folder initdb wants empty
        pwfile = Path(name)
        with os.fdopen(fd, "w") as fh:
            fh.write(self.password + "\n")
        if os.geteuid() == 0:
            entry = pwd.getpwnam("postgres")
            os.chown(self.data, entry.pw_uid, entry.pw_gid)
            os.chown(pwfile, entry.pw_uid, entry.pw_gid)
        cmd = [pg_bin("initdb"), "-D", str(self.data), "-U", "airflow", "--pwfile", str(pwfile), "-A", "scram-sha-256"]
        done = subprocess.run(_as_postgres(self.data, cmd), capture_output=True, text=True, check=False)
        pwfile.unlink(missing_ok=True)
        if done.returncode != 0:
            raise ServiceError(f"postgres: initdb failed: {(done.stderr or done.stdout).strip()[-500:]}")

    def up(self, timeout: float = 60.0) -> float:
        """Initialise the cluster once, start it, create the 'airflow' database; returns seconds waited."""
        if self.process.pid() is not None and self.answers():
            return 0.0
        require_free_port(self.name, self.host, self.port, "IMGEST_POSTGRES_PORT")
        self._init()
        cmd = [
            *(pg_bin("postgres"), "-D", str(self.data), "-p", str(self.port)),
            *("-c", f"listen_addresses={self.host}", "-c", "unix_socket_directories="),
            *("-c", "max_connections=200", "-c", "shared_buffers=64MB", "-c", "fsync=on"),
        ]
        self.process.start(_as_postgres(self.data, cmd), cwd=self.home)
        waited = self.process.wait_ready(self.answers, timeout, f"logins on {self.host}:{self.port}")
        self._create_database()
        return waited

    def _create_database(self) -> None:
        import psycopg2

        conn = psycopg2.connect(
            host=self.host, port=self.port, user="airflow", password=self.password, dbname="postgres"
        )
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = 'airflow'")
                if cur.fetchone() is None:
                    cur.execute("CREATE DATABASE airflow")
        finally:
            conn.close()

    def down(self) -> bool:
        """Fast shutdown (SIGINT: open sessions are ended, as an orchestrator's stop does), then the group."""
        import signal
        import time

        pid = self.process.pid()
        if pid is not None:
            os.kill(pid, signal.SIGINT)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and self.process.pid() is not None:
                time.sleep(0.2)
        return self.process.stop(timeout=30) or pid is not None


@dataclass(frozen=True)
class RedisServer:
    """Redis on HOST:PORT, Celery's broker."""

    home: Path
    port: int
    password: str
    host: str = "127.0.0.1"
    name: str = "redis"

    @property
    def process(self) -> ManagedProcess:
        return ManagedProcess(self.name, self.home / "redis.pid", self.home / "redis.log")

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@{self.host}:{self.port}/0"

    def answers(self) -> bool:
        return port_open(self.host, self.port)

    def up(self, timeout: float = 30.0) -> float:
        if self.process.pid() is not None and self.answers():
            return 0.0
        require_free_port(self.name, self.host, self.port, "IMGEST_REDIS_PORT")
        from shutil import which

        program = which("redis-server")
        if program is None:
            raise ServiceError(f"redis: 'redis-server' not found; {INSTALL_HINT}")
        conf = self.home / "redis.conf"
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(
                f"bind {self.host}\nport {self.port}\nrequirepass {self.password}\nprotected-mode yes\n"
                f'dir {self.home}\nsave ""\nappendonly no\ndaemonize no\n'
            )
        self.process.start([program, str(conf)], cwd=self.home)
        return self.process.wait_ready(self.answers, timeout, f"TCP on {self.host}:{self.port}")

    def down(self) -> bool:
        return self.process.stop(timeout=30)
