"""The dataset lock task of the ingest and refresh DAGs: one writer per dataset, DAG runs and CLI alike.

A run that finds the lock held waits for it without holding a worker slot: the task defers to Airflow's triggerer
(``DatasetLockTrigger`` watches the lock's stores) and comes back to take the lock when it is free, or to fail naming
the holder when the wait (``[imgest] lock_wait_s``, 6 h by default) runs out. ``deferrable=False`` (or ``[imgest]
lock_deferrable = 0`` for a deployment without a triggerer) waits in the worker instead, as the CLI does.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator

log = logging.getLogger(__name__)
DEFERRABLE_ENV = "IMGEST_LOCK_DEFERRABLE"
TRIGGER_GRACE_S = 600  # Airflow's own timeout of the deferral, past the trigger's deadline (a triggerer down)


def deferrable_default() -> bool:
    """Whether lock waits defer: ``$IMGEST_LOCK_DEFERRABLE`` (``[imgest] lock_deferrable``), on unless 0/false/no."""
    return os.environ.get(DEFERRABLE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


class DatasetLockOperator(BaseOperator):
    """Take (or, with ``release=True``, give back) the dataset's write lock for this DAG run. Taking it waits up to
    ``wait`` seconds for the run or CLI process that holds it, naming it in the log, deferred to the triggerer unless
    ``deferrable`` is False; then fails naming it."""

    template_fields: Sequence[str] = ("dataset",)

    def __init__(
        self,
        *,
        dataset: str,
        release: bool = False,
        wait: float | None = None,
        poll: float = 5,
        deferrable: bool | None = None,
        cassandra_conn_id: str = "cassandra_default",
        aws_conn_id: str = "aws_default",
        **kw: Any,
    ):
        super().__init__(**kw)
        self.dataset, self.release, self.wait, self.poll = dataset, release, wait, poll
        self.deferrable = deferrable  # None: [imgest] lock_deferrable, read when the task runs
        self.cassandra_conn_id = cassandra_conn_id  # the cluster of a keyspace that keeps the lock
        self.aws_conn_id = aws_conn_id  # the S3 store that keeps it otherwise

    def _store(self) -> Any:
        from imgest.operators.hooks import lock_store

        return lock_store(aws_conn_id=self.aws_conn_id, cassandra_conn_id=self.cassandra_conn_id)

    def execute(self, context: Any) -> str:
        from imgest.core import locks

        holder = locks.airflow_holder(self.dag_id, context["run_id"])
        if not self.dataset:  # the run failed before the dataset was known: nothing was taken
            return "no dataset"
        store = self._store()
        if self.release:
            freed = locks.release(self.dataset, holder, store)
            return f"released {self.dataset}" if freed else f"{self.dataset} was not held by this run"
        wait = self.wait if self.wait is not None else locks.default_wait()
        deferrable = self.deferrable if self.deferrable is not None else deferrable_default()
        if not deferrable:

            def waiting(other: locks.Holder) -> None:
                log.info("dataset %s is being written by %s (since %s): waiting", self.dataset, other.who, other.since)

            locks.acquire(self.dataset, holder, wait, self.poll, on_wait=waiting, store=store)
            return f"{holder.who} holds {self.dataset} (lock store {store.location})"
        return self._take_or_defer(holder, store, time.time() + wait, wait)

    def _take_or_defer(self, holder: Any, store: Any, deadline: float, wait: float) -> str:
        """Take the lock now, or (held by another, time left) defer until the trigger sees it free or DEADLINE."""
        from imgest.core import locks
        from imgest.operators.lock_trigger import DatasetLockTrigger

        try:
            locks.acquire(self.dataset, holder, 0, store=store)
        except locks.DatasetBusyError:
            left = deadline - time.time()
            if left <= 0:
                raise
            found = locks.blocker(self.dataset, holder.who, store)
            who = f"{found[0].who} (since {found[0].since or '?'})" if found else "another writer"
            log.info("dataset %s is being written by %s: waiting up to %.0fs, deferred to the triggerer (this "
                     "worker's slot is free meanwhile)", self.dataset, who, left)  # fmt: skip
            trigger = DatasetLockTrigger(
                self.dataset, holder.who, store.location, deadline, self.poll, self.aws_conn_id, self.cassandra_conn_id
            )
            self.defer(
                trigger=trigger,
                method_name="resume_after_wait",
                kwargs={"deadline": deadline, "wait": wait},
                timeout=timedelta(seconds=left + TRIGGER_GRACE_S),
            )
        return f"{holder.who} holds {self.dataset} (lock store {store.location})"

    def resume_after_wait(self, context: Any, event: dict[str, Any], deadline: float, wait: float) -> str:
        """Back from the triggerer: take the lock (deferring again if another writer took it first), or fail naming
        the holder the wait ran out on."""
        from imgest.core import locks
        from imgest.operators.lock_trigger import BUSY

        holder = locks.airflow_holder(self.dag_id, context["run_id"])
        store = self._store()
        if event.get("status") == BUSY:
            other = locks.Holder("unknown", str(event.get("who")), since=str(event.get("since") or ""))
            raise locks.busy_error(self.dataset, other, wait, str(event.get("location") or store.location))
        return self._take_or_defer(holder, store, deadline, wait)
