"""One writer per dataset: a lock file per dataset name, shared by the CLI and every DAG.

``$IMGEST_HOME/locks/<dataset>.json`` is created with O_EXCL and names its holder (a CLI process, or an
Airflow DAG run). Runs for other datasets never touch it, so they proceed in parallel; a second writer of
the same dataset waits (``wait`` seconds) or is refused with a message naming the holder. A CLI holder whose
process has died is stale and taken over; an Airflow holder is released by the run's last task (it runs
whatever happened), or by hand with ``imgest locks release <dataset>``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from imgest.core.errors import ImgestError
from imgest.core.paths import state_dir
from imgest.core.pids import pid_alive

log = logging.getLogger(__name__)


class DatasetBusyError(ImgestError):
    """Another run is writing the dataset."""


@dataclass(frozen=True)
class Holder:
    """Who holds a dataset's lock: 'cli' (pid, host, command) or 'airflow' (dag_id, run_id)."""

    kind: str
    who: str  # "pid 123 on host: imgest ingest cassandra" or "dag ingest_imagenet run manual__..."
    pid: int = 0
    host: str = ""
    since: str = ""

    def stale(self) -> bool:
        """A CLI holder whose process is gone (same host only); Airflow holders are released by their run."""
        return self.kind == "cli" and self.host == socket.gethostname() and not pid_alive(self.pid)


WAIT_ENV = "IMGEST_LOCK_WAIT_S"  # how long a DAG run waits for another writer of its dataset (default 6 h)


def default_wait() -> float:
    return float(os.environ.get(WAIT_ENV) or 6 * 3600)


def lock_dir() -> Path:
    return state_dir() / "locks"


def lock_path(dataset: str) -> Path:
    return lock_dir() / f"{dataset}.json"


def cli_holder(command: str) -> Holder:
    pid, host = os.getpid(), socket.gethostname()
    return Holder("cli", f"pid {pid} on {host}: {command}", pid, host, _now())


def airflow_holder(dag_id: str, run_id: str) -> Holder:
    return Holder("airflow", f"Airflow DAG {dag_id} run {run_id}", since=_now())


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def current(dataset: str) -> Holder | None:
    """The holder of DATASET's lock, or None when it is free."""
    try:
        return Holder(**json.loads(lock_path(dataset).read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError):  # half-written by a holder that is creating it right now
        return Holder("unknown", f"a writer creating {lock_path(dataset)}")


def try_acquire(dataset: str, holder: Holder) -> Holder | None:
    """Take DATASET's lock for HOLDER; returns None on success, else the other holder. Re-entrant for the same
    holder (a retried task); a stale CLI holder is taken over."""
    path = lock_path(dataset)
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(3):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            other = current(dataset)
            if other is None:
                continue
            if other.who == holder.who:
                return None
            if other.stale():
                log.warning("taking over the lock of %s from %s (process gone)", dataset, other.who)
                path.unlink(missing_ok=True)
                continue
            return other
        with os.fdopen(fd, "w") as fh:
            json.dump(asdict(holder), fh)
        return None
    return current(dataset)


def acquire(
    dataset: str, holder: Holder, wait: float = 0.0, poll: float = 5.0, on_wait: Callable[[Holder], None] | None = None
) -> None:
    """Take DATASET's lock, waiting up to WAIT seconds; DatasetBusyError names the holder after that."""
    deadline = time.monotonic() + wait
    while (other := try_acquire(dataset, holder)) is not None:
        if time.monotonic() >= deadline:
            waited = f" after waiting {wait:.0f}s" if wait else ""
            raise DatasetBusyError(
                f"dataset {dataset!r} is being written by {other.who} (since {other.since or '?'}){waited}; "
                f"wait for it to finish (CLI: --wait-lock SECONDS), or if it is gone: imgest locks release {dataset}"
            )
        if on_wait:
            on_wait(other)
        time.sleep(min(poll, max(0.1, deadline - time.monotonic())))


def release(dataset: str, holder: Holder | None = None) -> bool:
    """Free DATASET's lock (only HOLDER's when given); True if a lock was removed."""
    other = current(dataset)
    if other is None or (holder is not None and other.who != holder.who):
        return False
    lock_path(dataset).unlink(missing_ok=True)
    return True


def held() -> dict[str, Holder]:
    """dataset -> holder of every lock now taken."""
    out = {}
    for path in sorted(lock_dir().glob("*.json")) if lock_dir().is_dir() else []:
        holder = current(path.stem)
        if holder is not None:
            out[path.stem] = holder
    return out


@contextmanager
def dataset_lock(dataset: str, command: str, wait: float = 0.0) -> Iterator[Holder]:
    """Hold DATASET's lock for this process while the block runs (CLI writers)."""
    holder = cli_holder(command)
    acquire(dataset, holder, wait, on_wait=lambda other: log.info("waiting for %s to release %s", other.who, dataset))
    try:
        yield holder
    finally:
        release(dataset, holder)
