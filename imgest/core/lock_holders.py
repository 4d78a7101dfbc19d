"""Who holds a dataset's lock (imgest.core.locks): a CLI process or an Airflow run, its lease, and the attempt of a
task that may publish under it; the settings of waits and leases."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from imgest.core.paths import state_dir
from imgest.core.pids import pid_alive


@dataclass(frozen=True)
class Holder:
    """Who holds a dataset's lock: 'cli' (pid, host, command) or 'airflow' (dag_id, run_id), and for how long
    (LEASE_S seconds after its last renewal; 0: a record written before leases, never expires)."""

    kind: str
    who: str  # "pid 123 on host: imgest ingest cassandra" or "Airflow DAG ingest_imagenet run manual__..."
    pid: int = 0
    host: str = ""
    since: str = ""
    lease_s: float = 0.0

    def dead(self) -> bool:
        """A CLI holder on this host whose process is gone."""
        return self.kind == "cli" and self.host == socket.gethostname() and not pid_alive(self.pid)


@dataclass(frozen=True)
class Held:
    """A lock as read from its store: the holder, the record's age (store clock) and version."""

    holder: Holder
    age_s: float
    version: str

    def expired(self) -> bool:
        return self.holder.lease_s > 0 and self.age_s > self.holder.lease_s

    def stale(self) -> bool:
        """The holder died (CLI, this host) or its lease ran out: the next writer takes the lock over."""
        return self.holder.dead() or self.expired()

    def why_stale(self) -> str:
        if self.holder.dead():
            return "process gone"
        return f"lease of {self.holder.lease_s:.0f}s not renewed for {self.age_s:.0f}s"


@dataclass(frozen=True)
class Attempt:
    """One attempt of one task of the holding run (Airflow's task id and try number): the run holds the lock, and
    each task's latest attempt alone may publish under it (``claim``)."""

    task: str
    number: int

    def current_in(self, fields: dict[str, object]) -> bool:
        """No later attempt of this task is recorded in the lock record FIELDS."""
        attempts = fields.get("attempts")
        return int(attempts.get(self.task, 0) if isinstance(attempts, dict) else 0) <= self.number


WAIT_ENV = "IMGEST_LOCK_WAIT_S"  # how long a DAG run waits for another writer of its dataset (default 6 h)
LEASE_ENV = "IMGEST_LOCK_LEASE_S"  # a holder's lease; default 10 min for the CLI (renewed each minute), 6 h for a run
HOLDER_ENV = "IMGEST_LOCK_HOLDER"  # the holdings of the process that started this one (a Spark driver's submitter)


def default_wait() -> float:
    return float(os.environ.get(WAIT_ENV) or 6 * 3600)


def default_lease(kind: str) -> float:
    return float(os.environ.get(LEASE_ENV) or (600 if kind == "cli" else 6 * 3600))


def lock_dir() -> Path:
    return state_dir() / "locks"


def lock_path(dataset: str) -> Path:
    """The lock file of DATASET in the local store."""
    return lock_dir() / f"{dataset}.json"


def cli_holder(command: str, lease_s: float | None = None) -> Holder:
    pid, host = os.getpid(), socket.gethostname()
    lease = default_lease("cli") if lease_s is None else lease_s
    return Holder("cli", f"pid {pid} on {host}: {command}", pid, host, _now(), lease)


def airflow_holder(dag_id: str, run_id: str, lease_s: float | None = None) -> Holder:
    lease = default_lease("airflow") if lease_s is None else lease_s
    who = f"Airflow DAG {dag_id} run {run_id}"
    return Holder("airflow", who, host=socket.gethostname(), since=_now(), lease_s=lease)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
