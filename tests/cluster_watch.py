"""Watching a Spark standalone cluster while a job runs: executors' environments and the process list."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from imgest.services.spark_cluster import SparkCluster

FORBIDDEN_PREFIXES = ("IMGEST_", "AWS_")


def children(pid: int) -> list[int]:
    """Every descendant of PID, from /proc."""
    parent_of: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent_of[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        kids = [p for p, parent in parent_of.items() if parent == current]
        found += kids
        frontier += kids
    return found


def environ(pid: int) -> dict[str, str] | None:
    """The environment of process PID, or None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    pairs = (item.split("=", 1) for item in raw.decode("utf-8", "replace").split("\0") if "=" in item)
    return dict(pairs)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


@dataclass
class ClusterWatch:
    """Polls, until stopped: every process's whole command line (/proc/*/cmdline: `ps -eo args` in a child of
    Airflow cuts each at 80 columns, which hid a password at column 900 of spark-submit's), and the environment of
    every process below each worker."""

    cluster: SparkCluster
    every: float = 0.2
    command_lines: set[str] = field(default_factory=set)
    envs: dict[int, tuple[str, dict[str, str]]] = field(default_factory=dict)  # pid -> (cmdline, environ)
    workers: dict[int, dict[str, str]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def poll(self) -> None:
        for path in Path("/proc").glob("[0-9]*/cmdline"):
            line = cmdline(int(path.parent.name))
            if line:
                self.command_lines.add(line)
        for i in range(1, self.cluster.workers + 1):
            worker = self.cluster.process(i).pid()
            if worker is None:
                continue
            self.workers[worker] = environ(worker) or self.workers.get(worker, {})
            for pid in children(worker):
                env = environ(pid)
                if env is not None:
                    self.envs[pid] = (cmdline(pid), env)

    def run(self) -> None:
        while not self._stop.wait(self.every):
            self.poll()

    def __enter__(self) -> ClusterWatch:
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def executors(self) -> dict[int, dict[str, str]]:
        """Executor JVMs seen: pid -> environment."""
        return {p: env for p, (cmd, env) in self.envs.items() if "CoarseGrainedExecutorBackend" in cmd}

    def helpers(self) -> dict[int, str]:
        """Bulk-load helper JVMs seen below the workers (started by the executors' Python): pid -> command line."""
        from imgest.sinks.cassandra.bulk_helper import MAIN_CLASS

        return {p: cmd for p, (cmd, _) in self.envs.items() if MAIN_CLASS in cmd}

    def python_workers(self) -> dict[int, dict[str, str]]:
        """Python worker processes seen (pyspark.daemon and its forks): pid -> environment."""
        return {p: env for p, (cmd, env) in self.envs.items() if "pyspark" in cmd or "python" in cmd}

    def leaked(self) -> list[str]:
        """'pid: NAME' for every IMGEST_* / AWS_* variable seen below a worker, or PYSPARK_* in a worker."""
        found = [f"{p}: {k}" for p, (_, env) in self.envs.items() for k in env if k.startswith(FORBIDDEN_PREFIXES)]
        prefixes = (*FORBIDDEN_PREFIXES, "PYSPARK_")
        return found + [f"worker {p}: {k}" for p, env in self.workers.items() for k in env if k.startswith(prefixes)]


def files_holding(roots: list[Path], secrets: list[str]) -> list[str]:
    """'path: which secret' for every file under ROOTS (recursively) whose bytes contain one of SECRETS."""
    hits = []
    for root in roots:
        paths = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for path in paths:
            try:
                data = path.read_bytes()
            except OSError:
                continue
            hits += [f"{path}: secret #{i}" for i, s in enumerate(secrets) if s.encode() in data]
    return hits


def _masked(line: str, secret_values: list[str]) -> str:
    """LINE with each secret's value as *** (a failing check names where, never what)."""
    for value in secret_values:
        line = line.replace(value, "***")
    return line


def assert_clean(watch: ClusterWatch, cluster: SparkCluster, secret_values: list[str], logs: list[Path]) -> None:
    """Executors seen, their environment clean, the code shipped, spark-submit's whole command line seen, and no
    secret in any process's command line, environment or any file."""
    assert watch.executors(), "no executor was seen on the workers"
    assert watch.python_workers(), "no Python worker was seen on the workers"
    assert watch.leaked() == []
    shipped = [p for i in range(1, cluster.workers + 1) for p in cluster.worker_dirs(i)[0].glob("app-*/*/*.zip")]
    assert any(p.name == "imgest-pyfiles.zip" for p in shipped), shipped  # the code came with the submission
    submits = [line for line in watch.command_lines if "org.apache.spark.deploy.SparkSubmit" in line]
    assert [line for line in submits if " --conf " in line], "spark-submit's whole command line was never seen"
    leaked = [_masked(line, secret_values) for line in watch.command_lines if any(s in line for s in secret_values)]
    assert not leaked, f"a secret appeared in a process's command line (masked here): {leaked}"
    for env in (*watch.executors().values(), *watch.python_workers().values()):
        assert not [s for s in secret_values if s in "\n".join(env.values())]
    scanned = [*logs, cluster.home]
    assert files_holding(scanned, secret_values) == []
