"""The dataset lock fences publishing (file lock store): a holder whose lease ran out and was taken over raises
LockLostError, naming the new holder, at its next publish, and publishes nothing; a loss its renewals saw stays
lost; a Spark driver fences with the lock its submitter names in $IMGEST_LOCK_HOLDER."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from imgest.core import locks
from imgest.core.errors import ImgestError, LockLostError
from imgest.core.lock_stores import FileLockStore, store_at
from imgest.sinks.files.layout import staging_dir
from imgest.sinks.files.write import publish as publish_files
from imgest.sinks.shards.pack_publish import publish as publish_shards
from imgest.sinks.shards.store import open_store
from tests.lock_wait import take_over, wait_lost


@pytest.fixture
def store(tmp_path: Path) -> FileLockStore:
    return FileLockStore(tmp_path / "locks")


def _taken_over(dataset: str, first: locks.Holder, store: FileLockStore) -> locks.Holder:
    """FIRST's lease runs out (it renews nothing: a stalled host) and another run takes the lock over."""
    second = locks.airflow_holder("ingest_imagenet", "manual__second", lease_s=600)
    take_over(dataset, second, store)
    return second


def test_lost_lease_fails_the_shard_publish_and_leaves_manifest_json(store: FileLockStore, tmp_path: Path) -> None:
    first = locks.cli_holder("imgest ingest shards", lease_s=0.3)
    assert locks.try_acquire("imnet", first, store) is None
    shards = open_store(str(tmp_path / "shards"))
    with locks.holding("imnet", first, store):
        assert publish_shards(shards, {"key": "k1", "dataset": "imnet", "shards": []})  # held: published
        second = _taken_over("imnet", first, store)
        with pytest.raises(LockLostError) as lost:
            publish_shards(shards, {"key": "k2", "dataset": "imnet", "shards": []})
    assert isinstance(lost.value, ImgestError)
    message = str(lost.value)
    assert f"{first.who} lost the write lock of dataset 'imnet'" in message
    assert f"it is held by {second.who} since {second.since}" in message
    assert str(store.location) in message
    assert (shards.read_manifest() or {})["key"] == "k1"  # nothing switched
    held = locks.read("imnet", store)
    assert held is not None
    assert held.holder.who == second.who  # the fence did not touch the new holder's record


def test_lost_lease_fails_the_files_publish_before_anything_moves(store: FileLockStore, tmp_path: Path) -> None:
    dest = tmp_path / "files"
    staged = staging_dir(dest, "k1")
    staged.mkdir(parents=True)
    (staged / "samples.parquet").write_bytes(b"parquet")
    first = locks.cli_holder("imgest ingest files", lease_s=0.3)
    assert locks.try_acquire("imfiles", first, store) is None
    with locks.holding("imfiles", first, store):
        _taken_over("imfiles", first, store)
        with pytest.raises(LockLostError, match="Airflow DAG ingest_imagenet run manual__second"):
            publish_files(dest, "k1", {"format": "files", "dataset": "imfiles"})
    assert (staged / "samples.parquet").is_file()  # not renamed into v/
    assert not (dest / "manifest.json").exists()


def test_a_held_lease_is_renewed_by_the_fence(store: FileLockStore) -> None:
    holder = locks.cli_holder("imgest ingest shards", lease_s=0.5)
    assert locks.try_acquire("renewed", holder, store) is None
    with locks.holding("renewed", holder, store):
        for _ in range(4):  # two leases long: each fence restarts it, so nobody may take it over
            time.sleep(0.25)
            locks.check_fence("renewed")
        other = locks.cli_holder("imgest ingest cassandra", lease_s=600)
        assert locks.try_acquire("renewed", other, store) == holder


def test_a_loss_seen_by_keep_alive_stays_lost(store: FileLockStore) -> None:
    """Released by hand while the holder works: its renewal finds the lock gone, and the holder's next fence
    raises even though the same holder took the lock again meanwhile (its work since then is not trusted)."""
    holder = locks.cli_holder("imgest refresh imnet", lease_s=0.4)  # renewed every 0.1 s
    assert locks.try_acquire("handfree", holder, store) is None
    with locks.keep_alive("handfree", holder, store):
        locks.check_fence("handfree")
        assert locks.release("handfree", store=store)  # imgest locks release handfree
        wait_lost("handfree")  # its next renewal finds the lock gone
        assert locks.try_acquire("handfree", holder, store) is None
        with pytest.raises(LockLostError, match=r"lost the write lock of dataset 'handfree'"):
            locks.check_fence("handfree")


def test_released_lock_names_nobody(store: FileLockStore) -> None:
    holder = locks.cli_holder("imgest ingest shards", lease_s=600)
    assert locks.try_acquire("gone", holder, store) is None
    assert locks.release("gone", store=store)
    with locks.holding("gone", holder, store), pytest.raises(LockLostError, match="nobody holds it now"):
        locks.check_fence("gone")


def test_no_holding_nothing_to_fence(store: FileLockStore) -> None:
    """A library call outside a locked run (a benchmark, a test) publishes without a lock to prove."""
    locks.check_fence("never-locked")
    assert locks.read("never-locked", store) is None


def test_two_renewers_of_one_run_both_hold(store: FileLockStore) -> None:
    """Two tasks of one run renew at once: the one whose conditional write loses still holds (the record is its
    run's, just renewed), a taker's record is not."""
    holder = locks.airflow_holder("refresh_x", "scheduled__1", lease_s=600)
    assert locks.try_acquire("both", holder, store) is None
    stale = store.read("both")
    assert stale is not None
    assert locks.renew("both", holder, store)
    assert not store.replace("both", stale.fields, stale.version)  # the other task's write, against the old version
    assert locks.renew("both", holder, store)
    assert not locks.renew("both", locks.airflow_holder("refresh_x", "scheduled__2"), store)


def test_the_driver_fences_with_its_submitters_lock(store: FileLockStore, monkeypatch: pytest.MonkeyPatch) -> None:
    holder = locks.cli_holder("imgest ingest shards", lease_s=0.3)
    assert locks.try_acquire("driven", holder, store) is None
    assert locks.holder_env() == {}
    with locks.holding("driven", holder, store):
        env = locks.holder_env()
    (entry,) = json.loads(env[locks.HOLDER_ENV])
    assert (entry["dataset"], entry["store"], entry["holder"]["who"]) == ("driven", store.location, holder.who)
    assert store_at(entry["store"]).location == store.location
    monkeypatch.setenv(locks.HOLDER_ENV, env[locks.HOLDER_ENV])
    with locks.submitter_holdings():  # what a job's main runs under
        locks.check_fence("driven")
        _taken_over("driven", holder, store)
        with pytest.raises(LockLostError, match="held by Airflow DAG ingest_imagenet run manual__second"):
            locks.check_fence("driven")
    locks.check_fence("driven")  # the driver's holdings end with its job


class _AwayStore(FileLockStore):
    """The file store, away (every write raises, as an S3 store whose credentials expired) while AWAY is set."""

    away = False

    def replace(self, *args: object, **kwargs: object) -> bool:  # type: ignore[override]
        if self.away:
            raise ConnectionError("the lock store does not answer")
        return super().replace(*args, **kwargs)  # type: ignore[arg-type]


def test_a_lease_that_ran_out_unrenewed_publishes_nothing_even_when_the_store_is_back(tmp_path: Path) -> None:
    """Renewals fail for longer than the lease (nobody took the lock over, but somebody could have): the holder's
    next fence raises even once the store answers again; failures shorter than the lease are waited out."""
    store = _AwayStore(tmp_path / "locks")
    holder = locks.cli_holder("imgest ingest shards", lease_s=1.2)  # renewed every 0.3 s
    assert locks.try_acquire("away", holder, store) is None
    with locks.keep_alive("away", holder, store):
        store.away = True
        time.sleep(0.4)  # well within the lease: still held
        store.away = False
        time.sleep(0.5)
        locks.check_fence("away")
        store.away = True
        wait_lost("away")  # the lease runs out with no renewal through
        store.away = False
        with pytest.raises(LockLostError, match=r"lost the write lock of dataset 'away'"):
            locks.check_fence("away")


def test_threads_of_one_process_rewrite_a_record_at_once(store: FileLockStore) -> None:
    """A holder's keep-alive thread renews while its job's thread fences (seen in CI: both rewrote the record through
    one temporary file, and the second's rename found it gone). Two threads rewriting one record 500 times each:
    none raises, and the record is whole at the end."""
    import threading

    assert store.create("both", {"n": 0})
    errors: list[BaseException] = []

    def rewrite(k: int) -> None:
        try:
            for n in range(500):
                current = store.read("both")
                if current is not None:
                    store.replace("both", {"n": n, "by": k}, current.version)
        except BaseException as exc:  # what the test reports
            errors.append(exc)

    threads = [threading.Thread(target=rewrite, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    record = store.read("both")
    assert record is not None
    assert set(record.fields) == {"n", "by"}
    assert not list(store.folder.glob("*.tmp"))  # no temporary file left behind
