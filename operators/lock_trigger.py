"""The dataset lock's wait, off the worker: a trigger that watches the lock's stores from Airflow's triggerer while the
waiting task is deferred (its worker slot free), and fires when the lock is free (or its holder's lease ran out) or
when the wait's deadline passes. It only reads the stores; the task takes the lock when it resumes, and defers again
should another writer have been quicker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent
from asgiref.sync import sync_to_async

FREE, BUSY = "free", "busy"


class DatasetLockTrigger(BaseTrigger):
    """Fires ``{"status": "free"}`` once no live holder other than WHO holds DATASET's lock in the stores at LOCATION
    (``LockStores.location``, reached through the two connections), or ``{"status": "busy", "who": ..., "since": ...,
    "location": ...}`` at DEADLINE (seconds since the epoch) naming the holder. Reads every POLL seconds."""

    def __init__(
        self,
        dataset: str,
        who: str,
        location: str,
        deadline: float,
        poll: float = 5.0,
        aws_conn_id: str = "aws_default",
        cassandra_conn_id: str = "cassandra_default",
    ) -> None:
        super().__init__()
        self.dataset, self.who, self.location, self.deadline, self.poll = dataset, who, location, deadline, poll
        self.aws_conn_id, self.cassandra_conn_id = aws_conn_id, cassandra_conn_id
        self._stores: Any = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "dataset": self.dataset,
                "who": self.who,
                "location": self.location,
                "deadline": self.deadline,
                "poll": self.poll,
                "aws_conn_id": self.aws_conn_id,
                "cassandra_conn_id": self.cassandra_conn_id,
            },
        )

    def _look(self) -> Any:
        """(holder, its store's location) of the live holder in the way, or None (sync: connections, store reads)."""
        from imgest.core import locks

        if self._stores is None:
            from imgest.operators.hooks import lock_stores_at

            self._stores = lock_stores_at(self.location, self.aws_conn_id, self.cassandra_conn_id)
        return locks.blocker(self.dataset, self.who, self._stores)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        look = sync_to_async(self._look)  # the task SDK's connection lookups are synchronous
        last = None
        while True:
            found = await look()
            if found is None:
                yield TriggerEvent({"status": FREE})
                return
            other, where = found
            if time.time() >= self.deadline:
                yield TriggerEvent({"status": BUSY, "who": other.who, "since": other.since, "location": where})
                return
            if other.who != last:
                self.log.info("dataset %s is being written by %s (since %s): waiting", self.dataset, other.who,
                              other.since)  # fmt: skip
                last = other.who
            await asyncio.sleep(max(0.1, min(self.poll, self.deadline - time.time())))
