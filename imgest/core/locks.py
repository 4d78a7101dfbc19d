"""One writer per dataset: a lock record per dataset name, shared by the CLI and every DAG, on any host.

The record (``<dataset>.json`` in the lock store, ``imgest.core.lock_stores``: ``$IMGEST_HOME/locks`` on one
machine, ``$IMGEST_STATE_URL``/locks in S3 across hosts) is created only if absent and names its holder (a CLI
process, or an Airflow DAG run) and its lease. Runs for other datasets never touch it, so they proceed in
parallel; a second writer of the same dataset waits (``wait`` seconds) or is refused with a message naming the
holder. The holder renews its lease while it works (``keep_alive``: the CLI for its whole command, the DAG's
Spark tasks while they run). A holder is stale, and the next writer takes the lock over (a conditional write
that exactly one taker wins), when its lease ran out on the store's clock, or, at once, when it is a CLI process
on this host that has died. An Airflow holder is released by its run's last task (it runs whatever happened),
or by hand with ``imgest locks release <dataset>``.

Holding is proven, not assumed, where it matters: each publishing step (a ``manifest.json`` switch, the Cassandra
version record, gc) first calls ``check_fence(dataset)``, which restarts the lease by a write conditional on the
version it just read (``fence``) and raises ``LockLostError``, naming the holder now, when the record is no longer
this holder's; a lost lease can therefore never be followed by a publish. The holdings a process proves are those
it registered (``keep_alive``: the CLI's ``dataset_lock`` and each Airflow task of a run); a Spark driver gets its
submitter's through ``$IMGEST_LOCK_HOLDER`` (``holder_env`` / ``submitter_holdings``). A process that registered
none (a library call, a benchmark) has nothing to prove.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass

from imgest.core.errors import ImgestError, LockLostError
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
from imgest.core.lock_stores import LockStore, Record, default_store, store_at

log = logging.getLogger(__name__)
__all__ = [
    "LEASE_ENV", "WAIT_ENV", "Attempt", "Held", "_now", "airflow_holder", "cli_holder",
    "default_lease", "default_wait", "lock_dir", "lock_path",
]  # fmt: skip


class DatasetBusyError(ImgestError):
    """Another run is writing the dataset."""


def _held(record: Record) -> Held:
    known = {k: v for k, v in record.fields.items() if k in Holder.__dataclass_fields__}
    try:
        holder = Holder(**known)
    except TypeError:
        holder = Holder("unknown", f"an unreadable lock record {known}")
    return Held(holder, record.age_s, record.version)


def read(dataset: str, store: LockStore | None = None) -> Held | None:
    """DATASET's lock as its store holds it, or None when it is free."""
    record = (store or default_store()).read(dataset)
    return None if record is None else _held(record)


def current(dataset: str, store: LockStore | None = None) -> Holder | None:
    """The holder of DATASET's lock, or None when it is free."""
    lock = read(dataset, store)
    return None if lock is None else lock.holder


def try_acquire(dataset: str, holder: Holder, store: LockStore | None = None) -> Holder | None:
    """Take DATASET's lock for HOLDER; returns None on success, else the other holder. Re-entrant for the same
    holder (a retried task: its lease is renewed); a stale holder is taken over by one conditional write."""
    store = store or default_store()
    for _ in range(5):
        if store.create(dataset, asdict(holder)):
            return None
        record = store.read(dataset)
        if record is None:
            continue
        other = _held(record)
        if other.holder.who == holder.who:
            if store.replace(dataset, asdict(holder), record.version):
                return None
            continue
        if other.stale():
            if store.replace(dataset, asdict(holder), record.version):
                log.warning("took over the lock of %s from %s (%s)", dataset, other.holder.who, other.why_stale())
                return None
            continue
        return other.holder
    return current(dataset, store)


def acquire(
    dataset: str,
    holder: Holder,
    wait: float = 0.0,
    poll: float = 5.0,
    on_wait: Callable[[Holder], None] | None = None,
    store: LockStore | None = None,
) -> None:
    """Take DATASET's lock, waiting up to WAIT seconds; DatasetBusyError names the holder after that."""
    store = store or default_store()
    deadline = time.monotonic() + wait
    while (other := try_acquire(dataset, holder, store)) is not None:
        if time.monotonic() >= deadline:
            waited = f" after waiting {wait:.0f}s" if wait else ""
            raise DatasetBusyError(
                f"dataset {dataset!r} is being written by {other.who} (since {other.since or '?'}){waited}; "
                f"wait for it to finish (CLI: --wait-lock SECONDS), or if it is gone: imgest locks release {dataset}"
                f" (lock store {store.location})"
            )
        if on_wait:
            on_wait(other)
        time.sleep(min(poll, max(0.1, deadline - time.monotonic())))


def _ours(record: Record | None, holder: Holder, attempt: Attempt | None = None) -> bool:
    """RECORD is HOLDER's, and no later attempt of ATTEMPT's task has claimed it (``claim``)."""
    if record is None or _held(record).holder.who != holder.who:
        return False
    return attempt is None or attempt.current_in(record.fields)


def renew(dataset: str, holder: Holder, store: LockStore | None = None, attempt: Attempt | None = None) -> bool:
    """Restart HOLDER's lease on DATASET by a write conditional on the version read; False when the lock is no
    longer HOLDER's, or (with ATTEMPT) when a later attempt of the same task holds it now."""
    store = store or default_store()
    record = store.read(dataset)
    if record is None or not _ours(record, holder, attempt):
        return False
    if store.replace(dataset, record.fields, record.version):  # rewritten as it is: only its age restarts
        return True
    # changed since it was read: by another renewal of this holder (another task of the run: the lease is fresh),
    # or by a taker (then it is no longer ours)
    return _ours(store.read(dataset), holder, attempt)


def claim(dataset: str, holder: Holder, attempt: Attempt, store: LockStore) -> None:
    """Record ATTEMPT as its task's current one in HOLDER's lock of DATASET (a conditional write): an older attempt
    of that task, a zombie resumed after its worker was given up, fails every fence from then on. LockLostError
    when the lock is not HOLDER's, or a later attempt of the task already claimed it."""
    for _ in range(10):
        record = store.read(dataset)
        if not _ours(record, holder, attempt):
            raise lost_error(dataset, holder, store, attempt)
        assert record is not None
        attempts = {**record.fields.get("attempts", {}), attempt.task: attempt.number}
        if store.replace(dataset, {**record.fields, "attempts": attempts}, record.version):
            return
    raise lost_error(dataset, holder, store, attempt)


def fence(dataset: str, holder: Holder, store: LockStore | None = None, attempt: Attempt | None = None) -> None:
    """Prove that HOLDER (ATTEMPT of its task, when given) holds DATASET's lock now, restarting its lease by a
    conditional write (S3 ``If-Match`` on the version read; the file store's version check); LockLostError naming
    who holds it otherwise. A publish that follows within the lease cannot be overtaken: a taker must first see the
    renewed lease run out."""
    store = store or default_store()
    if not renew(dataset, holder, store, attempt):
        raise lost_error(dataset, holder, store, attempt)


def lost_error(dataset: str, holder: Holder, store: LockStore, attempt: Attempt | None = None) -> LockLostError:
    """The error for HOLDER, which no longer holds DATASET's lock: who holds it now, and since when."""
    record = store.read(dataset)
    now = None if record is None else _held(record)
    if now is None:
        where = "nobody holds it now (it was released, by hand or by a writer that took it over)"
    elif attempt is not None and now.holder.who == holder.who and not attempt.current_in(record.fields):  # type: ignore[union-attr]
        later = record.fields["attempts"][attempt.task]  # type: ignore[union-attr]
        where = f"attempt {later} of task {attempt.task} holds it now; this is attempt {attempt.number}, a zombie"
    else:
        where = f"it is held by {now.holder.who} since {now.holder.since or '?'}"
    return LockLostError(
        f"{holder.who} lost the write lock of dataset {dataset!r}: {where} (lock store {store.location}). Its "
        "lease ran out before it was renewed, or the lock was released by hand: it publishes nothing; run it again "
        "once that writer is done"
    )


@dataclass
class Holding:
    """A lock this process holds and proves before publishing; LOST once a renewal found it gone."""

    holder: Holder
    store: LockStore
    lost: bool = False
    attempt: Attempt | None = None


_holdings: dict[str, Holding] = {}


@contextmanager
def holding(dataset: str, holder: Holder, store: LockStore, attempt: Attempt | None = None) -> Iterator[Holding]:
    """Register HOLDER's hold of DATASET for this process while the block runs (check_fence proves it)."""
    mine, before = Holding(holder, store, attempt=attempt), _holdings.get(dataset)
    _holdings[dataset] = mine
    try:
        yield mine
    finally:
        if before is None:
            _holdings.pop(dataset, None)
        else:
            _holdings[dataset] = before


def check_fence(dataset: str) -> None:
    """Called right before a step publishes DATASET: when this process holds DATASET's lock (``holding``), prove it
    still does (``fence``), or LockLostError; a lock a renewal already found lost stays lost. Nothing to prove
    when this process holds no lock on DATASET."""
    mine = _holdings.get(dataset)
    if mine is None:
        log.debug("publishing %s outside a held lock: nothing to fence", dataset)
        return
    if mine.lost:
        raise lost_error(dataset, mine.holder, mine.store, mine.attempt)
    fence(dataset, mine.holder, mine.store, mine.attempt)
    log.info("%s still holds the lock of %s: publishing (lease renewed)", mine.holder.who, dataset)


def held_by_me(dataset: str) -> str | None:
    """The holder name (``Holder.who``) under which this process holds DATASET's lock; None when it holds none."""
    mine = _holdings.get(dataset)
    return None if mine is None else mine.holder.who


def holder_env() -> dict[str, str]:
    """``$IMGEST_LOCK_HOLDER`` naming this process's holdings (dataset, holder, store), for a process it starts
    (spark-submit: the driver fences its publishing with them); {} when it holds none."""
    if not _holdings:
        return {}
    held_now = [
        {
            "dataset": d,
            "store": h.store.location,
            "holder": asdict(h.holder),
            "attempt": h.attempt and asdict(h.attempt),
        }
        for d, h in _holdings.items()
    ]
    return {HOLDER_ENV: json.dumps(held_now)}


@contextmanager
def submitter_holdings() -> Iterator[None]:
    """Hold what ``$IMGEST_LOCK_HOLDER`` names while the block runs (a Spark driver: its submitter's holdings, whose
    leases the submitter renews); the stores are reached with this environment's S3 settings."""
    raw = os.environ.get(HOLDER_ENV, "").strip()
    with ExitStack() as stack:
        for entry in json.loads(raw) if raw else []:
            holder = _held(Record(entry["holder"], "", 0.0)).holder
            attempt = Attempt(**entry["attempt"]) if entry.get("attempt") else None
            stack.enter_context(holding(entry["dataset"], holder, store_at(entry["store"]), attempt))
        yield


@contextmanager
def keep_alive(
    dataset: str, holder: Holder, store: LockStore | None = None, attempt: Attempt | None = None
) -> Iterator[None]:
    """Renew HOLDER's lease on DATASET every quarter lease (at most each minute) while the block runs, holding it
    for check_fence; a renewal that finds the lock gone marks it lost: the next fence raises LockLostError. So does a
    lease that ran out while no renewal got through (a store away, credentials that expired): another writer may
    have taken the lock meanwhile, so this one publishes nothing even if the store answers again by then."""
    store = store or default_store()
    every = min(60.0, holder.lease_s / 4) if holder.lease_s > 0 else 0.0
    stop = threading.Event()

    def beat(mine: Holding) -> None:
        renewed = time.monotonic()
        while not stop.wait(every):
            try:
                if not renew(dataset, holder, store, attempt):
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

    if attempt is not None:
        claim(dataset, holder, attempt, store)
    with holding(dataset, holder, store, attempt) as mine:
        thread = threading.Thread(target=beat, args=(mine,), name=f"lock-{dataset}", daemon=True) if every else None
        if thread:
            thread.start()
        try:
            yield
        finally:
            stop.set()
            if thread:
                thread.join(timeout=5)


def release(dataset: str, holder: Holder | None = None, store: LockStore | None = None) -> bool:
    """Free DATASET's lock (only HOLDER's when given); True if a lock was removed."""
    store = store or default_store()
    record = store.read(dataset)
    if record is None or (holder is not None and _held(record).holder.who != holder.who):
        return False
    return store.delete(dataset, record.version)


def held(store: LockStore | None = None) -> dict[str, Held]:
    """dataset -> lock of every lock now taken."""
    store = store or default_store()
    out = {}
    for name in store.names():
        lock = read(name, store)
        if lock is not None:
            out[name] = lock
    return out


@contextmanager
def dataset_lock(dataset: str, command: str, wait: float = 0.0, store: LockStore | None = None) -> Iterator[Holder]:
    """Hold DATASET's lock for this process while the block runs (CLI writers), renewing its lease."""
    store = store or default_store()
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
