"""One writer per dataset: a lock record per dataset name, shared by the CLI and every DAG, on any host.

The record (in the lock stores of ``imgest.core.lock_stores``: the keyspace a run writes, beside its S3
destination, ``$IMGEST_STATE_URL``/locks, or ``$IMGEST_HOME/locks`` on one machine) is created only if absent and
names its holder (a CLI process, or an Airflow DAG run), its lease and its epoch. Runs for other datasets never
touch it, so they proceed in parallel; a second writer of the same dataset waits (``wait`` seconds) or is refused
with a message naming the holder. The holder renews its lease while it works (``keep_alive``: the CLI for its whole
command, the DAG's Spark tasks while they run). A holder is stale, and the next writer takes the lock over (a
conditional write that exactly one taker wins), when its lease ran out on the store's clock, or, at once, when it is
a CLI process on this host that has died. An Airflow holder is released by its run's last task (it runs whatever
happened), or by hand with ``imgest locks release <dataset>``. The steps on one record are
``imgest.core.lock_records``'s (re-exported here).

Holding is proven, not assumed, where it matters: each publishing step (a ``manifest.json`` switch, the Cassandra
version record, gc) first calls ``check_fence(dataset)``, which restarts the lease by a write conditional on the
version it just read (``fence``) and raises ``LockLostError``, naming the holder now, when the record is no longer
this holder's, of this task attempt and of the epoch it started in; a lost lease can therefore never be followed by
a publish. The holdings a process proves are those it registered (``keep_alive``: the CLI's ``dataset_lock`` and
each Airflow task of a run); a Spark driver gets its submitter's through ``$IMGEST_LOCK_HOLDER`` (``holder_env`` /
``submitter_holdings``). A process that registered none (a library call, a benchmark) has nothing to prove.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass

from imgest.core.errors import LockLostError
from imgest.core.lock_holders import (  # re-exported: callers name them as locks.X
    HOLDER_ENV,
    LEASE_ENV,
    WAIT_ENV,
    Attempt,
    Held,
    Holder,
    _now,
    airflow_holder,
    cli_holder,
    default_lease,
    default_wait,
    lock_dir,
    lock_path,
)
from imgest.core.lock_records import (  # re-exported: callers name them as locks.X
    DatasetBusyError,
    _each,
    _held,
    acquire,
    blocker,
    busy_error,
    claim,
    current,
    fence,
    held,
    learn_epoch,
    lost_error,
    read,
    release,
    renew,
    try_acquire,
)
from imgest.core.lock_stores import LockStore, LockStores, Record, default_stores, store_at

log = logging.getLogger(__name__)
__all__ = [
    "LEASE_ENV",
    "WAIT_ENV",
    "Attempt",
    "DatasetBusyError",
    "Held",
    "LockLostError",
    "_now",
    "acquire",
    "airflow_holder",
    "blocker",
    "busy_error",
    "cli_holder",
    "current",
    "default_lease",
    "default_wait",
    "held",
    "lock_dir",
    "lock_path",
    "read",
    "try_acquire",
]  # fmt: skip


@dataclass
class Holding:
    """A lock this process holds in one store and proves before publishing; LOST once a renewal found it gone. The
    EPOCH is the lock's when this process started working under it (``lock_records``)."""

    holder: Holder
    store: LockStore
    lost: bool = False
    attempt: Attempt | None = None
    epoch: str | None = None


_holdings: dict[tuple[str, str], Holding] = {}  # (dataset, store location) -> this process's hold there


def _mine(dataset: str) -> list[Holding]:
    return [h for (name, _), h in _holdings.items() if name == dataset]


@contextmanager
def holding(
    dataset: str, holder: Holder, store: LockStore, attempt: Attempt | None = None, epoch: str | None = None
) -> Iterator[Holding]:
    """Register HOLDER's hold of DATASET in STORE for this process while the block runs (check_fence proves it)."""
    key = (dataset, store.location)
    mine, before = Holding(holder, store, attempt=attempt, epoch=epoch), _holdings.get(key)
    _holdings[key] = mine
    try:
        yield mine
    finally:
        if before is None:
            _holdings.pop(key, None)
        else:
            _holdings[key] = before


def check_fence(dataset: str) -> None:
    """Called right before a step publishes DATASET: when this process holds DATASET's lock (``holding``), prove it
    still does in each of its stores (``fence``), or LockLostError; a lock a renewal already found lost stays lost.
    Nothing to prove when this process holds no lock on DATASET."""
    held_now = _mine(dataset)
    if not held_now:
        log.debug("publishing %s outside a held lock: nothing to fence", dataset)
        return
    for mine in held_now:
        if mine.lost:
            raise lost_error(dataset, mine.holder, mine.store, mine.attempt, mine.epoch)
        fence(dataset, mine.holder, mine.store, mine.attempt, mine.epoch)
    log.info("%s still holds the lock of %s: publishing (lease renewed)", held_now[0].holder.who, dataset)


def held_by_me(dataset: str) -> str | None:
    """Who this process holds DATASET's lock as (``Holder.who``, and the lock's epoch when known: what the Cassandra
    version record names as its writer); None when it holds none."""
    held_now = _mine(dataset)
    if not held_now:
        return None
    first = held_now[0]
    return f"{first.holder.who} epoch {first.epoch}" if first.epoch else first.holder.who


def holder_env() -> dict[str, str]:
    """``$IMGEST_LOCK_HOLDER`` naming this process's holdings (dataset, holder, store, attempt, epoch), for a process
    it starts (spark-submit: the driver fences its publishing with them); {} when it holds none."""
    if not _holdings:
        return {}
    held_now = [
        {
            "dataset": d,
            "store": h.store.location,
            "holder": asdict(h.holder),
            "attempt": h.attempt and asdict(h.attempt),
            "epoch": h.epoch,
        }
        for (d, _), h in _holdings.items()
    ]
    return {HOLDER_ENV: json.dumps(held_now)}


@contextmanager
def submitter_holdings() -> Iterator[None]:
    """Hold what ``$IMGEST_LOCK_HOLDER`` names while the block runs (a Spark driver: its submitter's holdings, whose
    leases the submitter renews); the stores are reached with this environment's settings."""
    raw = os.environ.get(HOLDER_ENV, "").strip()
    with ExitStack() as stack:
        for entry in json.loads(raw) if raw else []:
            holder = _held(Record(entry["holder"], "", 0.0)).holder
            attempt = Attempt(**entry["attempt"]) if entry.get("attempt") else None
            store = store_at(entry["store"])
            stack.enter_context(holding(entry["dataset"], holder, store, attempt, entry.get("epoch")))
        yield


@contextmanager
def keep_alive(
    dataset: str, holder: Holder, store: LockStore | LockStores | None = None, attempt: Attempt | None = None
) -> Iterator[None]:
    """``keep_alive_in`` each store of DATASET's lock while the block runs."""
    with ExitStack() as stack:
        for one in _each(store):
            stack.enter_context(keep_alive_in(dataset, holder, one, attempt))
        yield


@contextmanager
def keep_alive_in(dataset: str, holder: Holder, store: LockStore, attempt: Attempt | None = None) -> Iterator[None]:
    """Renew HOLDER's lease on DATASET every quarter lease (at most each minute) while the block runs, holding it
    for check_fence in the epoch it has now (with ATTEMPT: claimed for that task attempt first); a renewal that
    finds the lock gone marks it lost: the next fence raises LockLostError. So does a lease that ran out while no
    renewal got through (a store away, credentials that expired): another writer may have taken the lock meanwhile,
    so this one publishes nothing even if the store answers again by then."""
    every = min(60.0, holder.lease_s / 4) if holder.lease_s > 0 else 0.0
    stop = threading.Event()

    def beat(mine: Holding) -> None:
        renewed = time.monotonic()
        while not stop.wait(every):
            try:
                if not renew(dataset, holder, store, attempt, mine.epoch):
                    mine.lost = True
                    log.error("lost the lock of %s: now held by %s", dataset, current(dataset, store))
                    return
                renewed = time.monotonic()
            except Exception as e:  # a store that is away for a moment: try again at the next beat
                if time.monotonic() - renewed >= holder.lease_s:
                    mine.lost = True
                    log.error("the lease of %s ran out: no renewal got through for %.0f s (last: %s); this run "
                              "publishes nothing", dataset, time.monotonic() - renewed, e)  # fmt: skip
                    return
                log.warning("could not renew the lock of %s: %s", dataset, e)

    epoch = claim(dataset, holder, attempt, store) if attempt is not None else learn_epoch(dataset, holder, store)
    with holding(dataset, holder, store, attempt, epoch) as mine:
        thread = threading.Thread(target=beat, args=(mine,), name=f"lock-{dataset}", daemon=True) if every else None
        if thread:
            thread.start()
        try:
            yield
        finally:
            stop.set()
            if thread:
                thread.join(timeout=5)


@contextmanager
def dataset_lock(
    dataset: str, command: str, wait: float = 0.0, store: LockStore | LockStores | None = None
) -> Iterator[Holder]:
    """Hold DATASET's lock (in each of its stores) for this process while the block runs (CLI writers), renewing
    its lease."""
    store = store or default_stores()
    holder = cli_holder(command)
    acquire(
        dataset,
        holder,
        wait,
        on_wait=lambda other: log.info("waiting for %s to release %s", other.who, dataset),
        store=store,
    )
    try:
        with keep_alive(dataset, holder, store):
            yield holder
    finally:
        release(dataset, holder, store)
