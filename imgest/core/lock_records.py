"""The steps on one dataset's lock record in one store (imgest.core.locks builds the holding on them): take it
(create, or take over a stale holder's), read it, renew it, claim it for a task attempt, prove it (fence), give it
back; each a write conditional on the version just read (imgest.core.lock_stores).

A record names its holder and its **epoch**, a fresh random tag written whenever the lock changes hands (created, or
taken over) and kept while its holder renews it. Every process that works under the lock learns the epoch when it
starts (``claim``, ``learn_epoch``) and proves it with each fence, so a process of a holding that ended (its lease
ran out, or the lock was released by hand) fails its fence even when the same run took the lock again since; the
Cassandra version record names it too (``imgest.sinks.cassandra.versions``).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict

from imgest.core.errors import ImgestError, LockLostError
from imgest.core.lock_holders import Attempt, Held, Holder
from imgest.core.lock_stores import LockStore, LockStores, Record, default_store, default_stores

log = logging.getLogger(__name__)


class DatasetBusyError(ImgestError):
    """Another run is writing the dataset."""


def _each(store: LockStore | LockStores | None) -> tuple[LockStore, ...]:
    """The stores a lock is taken in, in order: STORE's, or the default ones."""
    if store is None:
        return default_stores().stores
    return store.stores if isinstance(store, LockStores) else (store,)


def _held(record: Record) -> Held:
    known = {k: v for k, v in record.fields.items() if k in Holder.__dataclass_fields__}
    try:
        holder = Holder(**known)
    except TypeError:
        holder = Holder("unknown", f"an unreadable lock record {known}")
    return Held(holder, record.age_s, record.version)


def _new_epoch() -> str:
    return secrets.token_hex(6)


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
    holder (a retried task: its lease is renewed, its epoch kept); a stale holder is taken over by one conditional
    write (a new epoch)."""
    store = store or default_store()
    for _ in range(5):
        if store.create(dataset, {**asdict(holder), "epoch": _new_epoch()}):
            return None
        record = store.read(dataset)
        if record is None:
            continue
        other = _held(record)
        if other.holder.who == holder.who:
            kept = {**asdict(holder), "epoch": record.fields.get("epoch") or _new_epoch()}
            if store.replace(dataset, kept, record.version):
                return None
            continue
        if other.stale():
            if store.replace(dataset, {**asdict(holder), "epoch": _new_epoch()}, record.version):
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
    store: LockStore | LockStores | None = None,
) -> None:
    """Take DATASET's lock in each of its stores, in their order, waiting up to WAIT seconds in all;
    DatasetBusyError names the holder after that (and what was taken is given back)."""
    deadline, taken = time.monotonic() + wait, []
    try:
        for one in _each(store):
            _acquire_one(dataset, holder, max(0.0, deadline - time.monotonic()), poll, on_wait, one)
            taken.append(one)
    except BaseException:
        for one in taken:
            release(dataset, holder, one)
        raise


def _acquire_one(
    dataset: str, holder: Holder, wait: float, poll: float, on_wait: Callable[[Holder], None] | None, store: LockStore
) -> None:
    deadline = time.monotonic() + wait
    while (other := try_acquire(dataset, holder, store)) is not None:
        if time.monotonic() >= deadline:
            raise busy_error(dataset, other, wait, store.location)
        if on_wait:
            on_wait(other)
        time.sleep(min(poll, max(0.1, deadline - time.monotonic())))


def busy_error(dataset: str, other: Holder, waited_s: float, location: str) -> DatasetBusyError:
    """The error of a writer that did not get DATASET's lock from OTHER (after WAITED_S seconds) in the store at
    LOCATION."""
    waited = f" after waiting {waited_s:.0f}s" if waited_s else ""
    return DatasetBusyError(
        f"dataset {dataset!r} is being written by {other.who} (since {other.since or '?'}){waited}; "
        f"wait for it to finish (CLI: --wait-lock SECONDS), or if it is gone: imgest locks release {dataset}"
        f" (lock store {location})"
    )


def blocker(dataset: str, who: str, store: LockStore | LockStores) -> tuple[Holder, str] | None:
    """Who keeps WHO (a holder's ``who``) from DATASET's lock in STORE's stores, and where: a live holder other than
    WHO itself (None: free, WHO's own, or stale, which the next try takes over). Reads only: a waiter's poll."""
    for one in _each(store):
        record = one.read(dataset)
        if record is None:
            continue
        other = _held(record)
        if other.holder.who != who and not other.stale():
            return other.holder, one.location
    return None


def _ours(record: Record | None, holder: Holder, attempt: Attempt | None = None, epoch: str | None = None) -> bool:
    """RECORD is HOLDER's, of EPOCH (when known), and no later attempt of ATTEMPT's task has claimed it."""
    if record is None or _held(record).holder.who != holder.who:
        return False
    if epoch is not None and record.fields.get("epoch") != epoch:
        return False
    return attempt is None or attempt.current_in(record.fields)


def learn_epoch(dataset: str, holder: Holder, store: LockStore) -> str | None:
    """The epoch of HOLDER's lock of DATASET now (None when the lock is not HOLDER's, or predates epochs)."""
    record = store.read(dataset)
    if record is None or not _ours(record, holder):
        return None
    return str(record.fields.get("epoch") or "") or None


def renew(
    dataset: str,
    holder: Holder,
    store: LockStore | None = None,
    attempt: Attempt | None = None,
    epoch: str | None = None,
) -> bool:
    """Restart HOLDER's lease on DATASET by a write conditional on the version read; False when the lock is no
    longer HOLDER's, or (with ATTEMPT) when a later attempt of the same task holds it now, or (with EPOCH) when it
    changed hands since."""
    store = store or default_store()
    record = store.read(dataset)
    if record is None or not _ours(record, holder, attempt, epoch):
        return False
    if store.replace(dataset, record.fields, record.version):  # rewritten as it is: only its age restarts
        return True
    # changed since it was read: by another renewal of this holder (another task of the run: the lease is fresh),
    # or by a taker (then it is no longer ours)
    return _ours(store.read(dataset), holder, attempt, epoch)


def claim(dataset: str, holder: Holder, attempt: Attempt, store: LockStore) -> str | None:
    """Record ATTEMPT as its task's current one in HOLDER's lock of DATASET (a conditional write): an older attempt
    of that task, a zombie resumed after its worker was given up, fails every fence from then on. Returns the lock's
    epoch. LockLostError when the lock is not HOLDER's, or a later attempt of the task already claimed it."""
    for _ in range(10):
        record = store.read(dataset)
        if not _ours(record, holder, attempt):
            raise lost_error(dataset, holder, store, attempt)
        assert record is not None
        attempts = {**record.fields.get("attempts", {}), attempt.task: attempt.number}
        if store.replace(dataset, {**record.fields, "attempts": attempts}, record.version):
            return str(record.fields.get("epoch") or "") or None
    raise lost_error(dataset, holder, store, attempt)


def fence(
    dataset: str,
    holder: Holder,
    store: LockStore | None = None,
    attempt: Attempt | None = None,
    epoch: str | None = None,
) -> None:
    """Prove that HOLDER (ATTEMPT of its task, in EPOCH, when given) holds DATASET's lock now, restarting its lease
    by a conditional write (S3 ``If-Match`` on the version read; a transaction in a keyspace; the file store's
    version check); LockLostError naming who holds it otherwise. A publish that follows within the lease cannot be
    overtaken: a taker must first see the renewed lease run out."""
    store = store or default_store()
    if not renew(dataset, holder, store, attempt, epoch):
        raise lost_error(dataset, holder, store, attempt, epoch)


def lost_error(
    dataset: str, holder: Holder, store: LockStore, attempt: Attempt | None = None, epoch: str | None = None
) -> LockLostError:
    """The error for HOLDER, which no longer holds DATASET's lock: who holds it now, and since when."""
    record = store.read(dataset)
    now = None if record is None else _held(record)
    if now is None or record is None:
        where = "nobody holds it now (it was released, by hand or by a writer that took it over)"
    elif attempt is not None and now.holder.who == holder.who and not attempt.current_in(record.fields):
        later = record.fields["attempts"][attempt.task]
        where = f"attempt {later} of task {attempt.task} holds it now; this is attempt {attempt.number}, a zombie"
    elif epoch is not None and now.holder.who == holder.who and record.fields.get("epoch") != epoch:
        where = (
            f"it was given up and taken again since (epoch {record.fields.get('epoch')}; this process worked "
            f"under epoch {epoch})"
        )
    else:
        where = f"it is held by {now.holder.who} since {now.holder.since or '?'}"
    return LockLostError(
        f"{holder.who} lost the write lock of dataset {dataset!r}: {where} (lock store {store.location}). Its "
        "lease ran out before it was renewed, or the lock was released by hand: it publishes nothing; run it again "
        "once that writer is done"
    )


def release(dataset: str, holder: Holder | None = None, store: LockStore | LockStores | None = None) -> bool:
    """Free DATASET's lock in each of its stores (only HOLDER's when given); True if a lock was removed."""
    freed = False
    for one in reversed(_each(store)):
        record = one.read(dataset)
        if record is None or (holder is not None and _held(record).holder.who != holder.who):
            continue
        freed = one.delete(dataset, record.version) or freed
    return freed


def held(store: LockStore | LockStores | None = None) -> dict[str, Held]:
    """dataset -> lock of every lock now taken (in the first of the stores that holds it)."""
    out: dict[str, Held] = {}
    for one in _each(store):
        for name in one.names():
            lock = read(name, one)
            if lock is not None:
                out.setdefault(name, lock)
    return out
