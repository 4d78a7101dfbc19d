"""The holder of a run's lock is the task attempt: a later attempt of the same task claims it, and the older one, a
zombie whose worker Airflow gave up on but which still runs, fails every fence from then on and publishes nothing;
the switch of manifest.json lands only over the manifest its publisher read (a folder here; S3 in
tests/integration/test_zombie_publish.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from imgest.core import locks
from imgest.core.lock_stores import FileLockStore
from imgest.sinks.shards.manifest_switch import ABSENT, ManifestConflictError, read_live, switch
from imgest.sinks.shards.pack_publish import publish as publish_shards
from imgest.sinks.shards.store import open_store

RUN = locks.airflow_holder("ingest_imagenet", "manual__r1", lease_s=600)


@pytest.fixture
def store(tmp_path: Path) -> FileLockStore:
    found = FileLockStore(tmp_path / "locks")
    assert locks.try_acquire("ds", RUN, found) is None
    return found


def test_a_later_attempt_of_the_task_fences_out_the_older(store: FileLockStore, tmp_path: Path) -> None:
    shards = open_store(str(tmp_path / "shards"))
    first, second = locks.Attempt("ingest_shards", 1), locks.Attempt("ingest_shards", 2)
    with locks.keep_alive("ds", RUN, store, first):  # claims attempt 1
        assert publish_shards(shards, {"key": "k1", "dataset": "ds", "shards": []})
        locks.claim("ds", RUN, second, store)  # Airflow retried the task elsewhere: attempt 2 starts
        with pytest.raises(locks.LockLostError) as zombie:
            publish_shards(shards, {"key": "k-zombie", "dataset": "ds", "shards": []})
    text = str(zombie.value)
    assert "attempt 2 of task ingest_shards holds it now; this is attempt 1, a zombie" in text
    assert (shards.read_manifest() or {})["key"] == "k1"  # nothing switched
    locks.fence("ds", RUN, store, second)  # the current attempt proves its holding
    locks.fence("ds", RUN, store, locks.Attempt("verify", 1))  # other tasks of the run are not affected
    with pytest.raises(locks.LockLostError):
        locks.claim("ds", RUN, first, store)  # the zombie cannot claim back


def test_renewals_keep_every_tasks_attempt(store: FileLockStore) -> None:
    locks.claim("ds", RUN, locks.Attempt("ingest_shards", 3), store)
    locks.claim("ds", RUN, locks.Attempt("read_throughput", 1), store)
    assert locks.renew("ds", RUN, store)
    record = store.read("ds")
    assert record is not None
    assert record.fields["attempts"] == {"ingest_shards": 3, "read_throughput": 1}


def test_another_run_cannot_claim(store: FileLockStore) -> None:
    other = locks.airflow_holder("ingest_imagenet", "manual__r2", lease_s=600)
    with pytest.raises(locks.LockLostError, match="held by Airflow DAG ingest_imagenet run manual__r1"):
        locks.claim("ds", other, locks.Attempt("ingest_shards", 1), store)


def test_the_switch_lands_only_over_the_manifest_read(tmp_path: Path) -> None:
    shards = open_store(str(tmp_path / "shards"))
    assert read_live(shards) == (None, ABSENT)
    switch(shards, {"key": "a"}, ABSENT)
    live, version = read_live(shards)
    assert live == {"key": "a"}
    with pytest.raises(ManifestConflictError, match="changed since this run read it"):
        switch(shards, {"key": "b"}, ABSENT)  # a writer that read no manifest, after one was published
    switch(shards, {"key": "c"}, version)
    with pytest.raises(ManifestConflictError):
        switch(shards, {"key": "d"}, version)  # the version it read is gone
    assert read_live(shards)[0] == {"key": "c"}


def test_a_task_of_an_earlier_epoch_of_the_same_run_publishes_nothing(store: FileLockStore, tmp_path: Path) -> None:
    """The lock names its epoch, new each time it changes hands: a task of run r1 that started under the first
    epoch, still running after the lock was released by hand and taken again by r1 (its lock task retried), fails its
    fence; a task that starts under the new epoch publishes, and the Cassandra version record would name it."""
    shards = open_store(str(tmp_path / "shards"))
    first = locks.read("ds", store)
    assert first is not None
    with locks.keep_alive("ds", RUN, store, locks.Attempt("pack", 1)):
        old_epoch = locks.held_by_me("ds")
        assert old_epoch is not None
        assert old_epoch.startswith(f"{RUN.who} epoch ")
        assert locks.release("ds", None, store)  # imgest locks release ds
        assert locks.try_acquire("ds", RUN, store) is None  # the same run takes it again: a new epoch
        assert locks.try_acquire("ds", RUN, store) is None  # re-entrant: the epoch stays
        with pytest.raises(locks.LockLostError, match=r"given up and taken again since \(epoch \w+; this process"):
            publish_shards(shards, {"key": "k-old-epoch", "dataset": "ds", "shards": []})
    assert shards.read_manifest() is None  # nothing switched
    with locks.keep_alive("ds", RUN, store, locks.Attempt("pack", 1)):
        assert locks.held_by_me("ds") not in (None, old_epoch)
        assert publish_shards(shards, {"key": "k-new", "dataset": "ds", "shards": []})
