"""A local Spark standalone cluster: a master and two workers of imgest's Spark (spark.distribution), on loopback.

The deploy Master and Worker classes run through the package's ``spark-class``. Each worker starts with a
clean environment (no ``IMGEST_*``, ``AWS_*`` or ``PYSPARK_*`` variables, nothing of the caller's besides
``JAVA_HOME``) and its own work folder (executor stdout/stderr, shipped files) and scratch folder
(``SPARK_LOCAL_DIRS``), so a job that runs here gets everything it needs from its submission.
Ports: ``IMGEST_SPARK_MASTER_PORT`` (7077), ``IMGEST_SPARK_UI_PORT`` (8090; workers' UIs on the next ports).
Sizes: ``IMGEST_SPARK_WORKERS`` (2), ``IMGEST_SPARK_WORKER_CORES`` (1), ``IMGEST_SPARK_WORKER_MEMORY`` (1536m).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from imgest.core.errors import ServiceError
from imgest.core.paths import conf_file, state_dir
from imgest.core.settings import EMBEDDED_HOST, env_int
from imgest.services.base import ServiceStatus, UpResult
from imgest.services.process import ManagedProcess, require_free_port

log = logging.getLogger(__name__)
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
CLEAN_PATH = "/usr/local/bin:/usr/bin:/bin"


def spark_home() -> Path:
    """The Spark the services run (imgest.spark.distribution; ConfigError where there is none)."""
    from imgest.spark.distribution import require_home

    return require_home()


def clean_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a master or worker: PATH, HOME, locale, Java and Spark's own folders only."""
    env = {
        "PATH": CLEAN_PATH,
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": EMBEDDED_HOST,
        "SPARK_CONF_DIR": str(home / "conf"),
        "SPARK_LOG_DIR": str(home / "logs"),
        # the master's and workers' own JVMs take the flags imgest gives Spark's drivers and executors
        "SPARK_DAEMON_JAVA_OPTS": os.environ.get("IMGEST_SPARK_JAVA_OPTIONS", "").strip(),
    }
    if os.environ.get("JAVA_HOME"):
        env["JAVA_HOME"] = os.environ["JAVA_HOME"]
    return {k: v for k, v in {**env, **(extra or {})}.items() if v != ""}


@dataclass(frozen=True)
class SparkCluster:
    """A standalone master on HOST:PORT and WORKERS workers of CORES cores and MEMORY each."""

    home: Path
    port: int = 7077
    ui_port: int = 8090
    workers: int = 2
    cores: int = 1
    memory: str = "1536m"
    host: str = EMBEDDED_HOST
    name: str = "spark"
    hide: tuple[str, ...] = ()  # folders the workers must not see (test harness: an empty tmpfs over each)

    @classmethod
    def default(cls) -> SparkCluster:
        return cls(
            home=state_dir() / "spark-cluster",
            port=env_int("IMGEST_SPARK_MASTER_PORT", 7077),
            ui_port=env_int("IMGEST_SPARK_UI_PORT", 8090),
            workers=env_int("IMGEST_SPARK_WORKERS", 2),
            cores=env_int("IMGEST_SPARK_WORKER_CORES", 1),
            memory=os.environ.get("IMGEST_SPARK_WORKER_MEMORY", "1536m"),
        )

    @property
    def master_url(self) -> str:
        """spark://host:port, the value of --master and of the spark_default connection."""
        return f"spark://{self.host}:{self.port}"

    def process(self, index: int) -> ManagedProcess:
        """The master (0) or worker INDEX (1..workers)."""
        role = "master" if index == 0 else f"worker{index}"
        return ManagedProcess(f"spark-{role}", self.home / role / f"{role}.pid", self.home / role / f"{role}.log")

    def worker_dirs(self, index: int) -> tuple[Path, Path]:
        """(work folder, scratch folder) of worker INDEX."""
        base = self.home / f"worker{index}"
        return base / "work", base / "scratch"

    def master_command(self) -> list[str]:
        """The master's command line (pure)."""
        spark_class = str(spark_home() / "bin" / "spark-class")
        return [
            *(spark_class, MASTER_CLASS, "--host", self.host),
            *("--port", str(self.port), "--webui-port", str(self.ui_port)),
        ]

    def worker_command(self, index: int) -> list[str]:
        """Worker INDEX's command line (pure): its cores, memory, work folder and UI port."""
        work, _ = self.worker_dirs(index)
        spark_class = str(spark_home() / "bin" / "spark-class")
        command = [
            *(spark_class, WORKER_CLASS, self.master_url, "--host", self.host),
            *("--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(work)),
            *("--webui-port", str(self.ui_port + index)),
        ]
        return self._hidden(command) if self.hide else command

    def _hidden(self, command: list[str]) -> list[str]:
        """COMMAND in a private mount namespace where each HIDE folder is an empty tmpfs: the worker and its
        executors see none of the files there, as a machine without a shared filesystem would not (needs root)."""
        mounts = " && ".join(f"mount -t tmpfs -o size=1m,mode=0755 imgest-hidden {shlex.quote(p)}" for p in self.hide)
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{mounts} && exec "$@"', "sh", *command]

    def worker_env(self, index: int) -> dict[str, str]:
        """Worker INDEX's whole environment: clean, with its own scratch folder for executors."""
        work, scratch = self.worker_dirs(index)
        return clean_env(work.parent, {"SPARK_LOCAL_DIRS": str(scratch), "SPARK_WORKER_DIR": str(work)})

    def master_state(self) -> dict | None:
        """The master's /json answer (workers, apps), or None when it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.ui_port}/json/", timeout=2) as resp:
                return json.loads(resp.read())
        except (OSError, ValueError):
            return None

    def _alive_ids(self) -> list[str]:
        state = self.master_state() or {}
        return [w["id"] for w in state.get("workers", []) if w.get("state") == "ALIVE"]

    def alive_workers(self) -> int:
        """Workers registered with the master and ALIVE."""
        state = self.master_state() or {}
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def answers(self) -> bool:
        """True when the master answers and every worker has registered."""
        return self.alive_workers() >= self.workers

    def _prepare(self, role: str) -> Path:
        base = self.home / role
        (base / "conf").mkdir(parents=True, exist_ok=True)
        (base / "logs").mkdir(parents=True, exist_ok=True)
        log4j = base / "conf" / "log4j2.properties"
        log4j.write_text(conf_file("spark-log4j2.properties").read_text())
        return base

    def up(self, timeout: float = 120.0) -> UpResult:
        """Start the master, then the workers; wait until every worker is registered."""
        if self.answers():
            return UpResult(self.name, False, 0.0, f"spark already running at {self.master_url}")
        try:
            if self.process(0).pid() is None:
                require_free_port(self.name, self.host, self.port, "IMGEST_SPARK_MASTER_PORT")
                require_free_port(self.name, self.host, self.ui_port, "IMGEST_SPARK_UI_PORT")
                base = self._prepare("master")
                self.process(0).start(self.master_command(), env=clean_env(base), cwd=base)
            waited = self.process(0).wait_ready(lambda: self.master_state() is not None, timeout, "on its web UI")
            for i in range(1, self.workers + 1):
                if self.process(i).pid() is None:
                    base = self._prepare(f"worker{i}")
                    for folder in self.worker_dirs(i):
                        folder.mkdir(parents=True, exist_ok=True)
                    self.process(i).start(self.worker_command(i), env=self.worker_env(i), cwd=base)
            waited += self.process(self.workers).wait_ready(self.answers, timeout, "with all workers registered")
        except BaseException:
            self.down()
            raise
        return UpResult(
            self.name,
            True,
            waited,
            f"spark standalone at {self.master_url} (UI http://{self.host}:{self.ui_port}) with {self.workers} "
            f"workers x {self.cores} cores / {self.memory} after {waited:.1f}s; folders under {self.home}",
        )

    def restart_workers(self, timeout: float = 120.0) -> None:
        """Stop the workers and start them again with this cluster's commands (its HIDE), the master kept."""
        before = set(self._alive_ids())
        for i in range(self.workers, 0, -1):
            self.process(i).stop()
        for i in range(1, self.workers + 1):
            self.process(i).start(self.worker_command(i), env=self.worker_env(i), cwd=self._prepare(f"worker{i}"))
        deadline = time.monotonic() + timeout
        while len((alive := set(self._alive_ids())) - before) < self.workers or alive & before:
            if time.monotonic() > deadline:
                raise ServiceError(f"spark workers did not register again with {self.master_url} in {timeout:.0f}s")
            time.sleep(0.5)

    def down(self) -> bool:
        """Stop the workers (and their executors), then the master."""
        stopped = [self.process(i).stop() for i in range(self.workers, -1, -1)]
        return any(stopped)

    def status(self) -> ServiceStatus:
        """One line: the master's address and PID, workers alive."""
        pids = [self.process(i).pid() for i in range(self.workers + 1)]
        alive = self.alive_workers()
        detail = f"workers alive {alive}/{self.workers}; pids {','.join(str(p or '-') for p in pids)}"
        return ServiceStatus(self.name, self.master_url, pids[0], alive >= self.workers, detail)

    def check_running(self) -> None:
        """ServiceError unless the cluster answers with every worker."""
        if not self.answers():
            raise ServiceError(f"spark standalone at {self.master_url} is not running; `imgest services up spark`")
