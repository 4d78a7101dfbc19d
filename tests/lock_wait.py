"""Taking a dataset's lock over once its holder's lease ran out: polled with a deadline that fails loudly, never a
sleep of the lease's length that a slow host's clock or scheduler can outrun."""

from __future__ import annotations

import time

import pytest

from imgest.core import locks
from imgest.core.lock_stores import LockStore


def take_over(dataset: str, holder: locks.Holder, store: LockStore, limit_s: float = 30.0) -> None:
    """HOLDER takes DATASET's lock in STORE as soon as the current holder's lease has run out (it renews nothing: a
    stalled host); fails naming the holder when it is still held after LIMIT_S."""
    deadline = time.monotonic() + limit_s
    while (other := locks.try_acquire(dataset, holder, store)) is not None:
        if time.monotonic() > deadline:
            pytest.fail(f"{dataset}: still held by {other.who} after {limit_s:.0f} s; its lease never ran out")
        time.sleep(0.05)


def wait_lost(dataset: str, limit_s: float = 30.0) -> None:
    """Until this process's keep-alive of DATASET has marked its hold lost (a renewal found the lock gone, or none
    got through for a lease); fails loudly after LIMIT_S."""
    deadline = time.monotonic() + limit_s
    while not any(h.lost for h in locks._mine(dataset)):
        if time.monotonic() > deadline:
            pytest.fail(f"{dataset}: the keep-alive never marked its hold lost in {limit_s:.0f} s")
        time.sleep(0.05)
