"""The lock of a dataset written to Cassandra lives in the keyspace it writes (``<keyspace>.imgest_locks``), on the
real node: its store changes only what it read (lightweight transactions); writers on different "hosts" (own
hostname, own empty IMGEST_HOME, nothing shared but the node) race and exactly one writes; a laptop's CLI on a local
master with no state URL and a cluster's DAG run (IMGEST_STATE_URL set) writing one keyspace exclude each other;
a run writing both targets holds both locks, and gives back the first when it cannot get the second."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from imgest.core import locks
from imgest.core.lock_stores import LockStores, S3LockStore, cassandra_lock_url, lock_url_for, stores_at
from imgest.core.settings import CassandraSettings
from imgest.services.cassandra import CassandraServer
from imgest.services.s3 import S3Server
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sinks.cassandra.lock_store import CassandraLockStore

pytestmark = pytest.mark.services


def _settings(server: CassandraServer) -> CassandraSettings:
    return CassandraSettings(hosts=(server.host,), port=server.native_port)


def _keyspace_store(server: CassandraServer, keyspace: str) -> CassandraLockStore:
    return CassandraLockStore(cassandra_lock_url(_settings(server), keyspace, "SimpleStrategy:1"), _settings(server))


def test_the_keyspace_store_changes_only_what_it_read(cassandra_server: CassandraServer) -> None:
    """A keyspace that does not exist yet is made by the first lock (with the run's replication); each step is a
    transaction on the version read; a record's age is the coordinator's."""
    keyspace = f"lockks_{secrets.token_hex(3)}"
    store = _keyspace_store(cassandra_server, keyspace)
    assert store.read("d") is None
    assert store.names() == []
    assert store.create("d", {"who": "a"})
    assert not store.create("d", {"who": "b"})  # exists: refused
    first = store.read("d")
    assert first is not None
    assert first.fields == {"who": "a"}
    assert 0 <= first.age_s < 60
    time.sleep(1.2)
    aged = store.read("d")
    assert aged is not None
    assert aged.age_s >= 1.0
    assert store.replace("d", {"who": "c"}, first.version)
    assert not store.replace("d", {"who": "e"}, first.version)  # changed since it was read: refused
    assert not store.delete("d", first.version)
    now = store.read("d")
    assert now is not None
    assert now.fields == {"who": "c"}
    assert now.age_s < aged.age_s
    assert store.names() == ["d"]
    assert store.delete("d", now.version)
    assert store.read("d") is None
    with cassandra_session(_settings(cassandra_server)) as session:
        strategy = session.cluster.metadata.keyspaces[keyspace].replication_strategy
        assert "SimpleStrategy" in type(strategy).__name__
        assert strategy.replication_factor == 1
        session.execute(f"DROP KEYSPACE {keyspace}", timeout=60)


CONTENDER = """
import sys, time
from pathlib import Path
from imgest.core import locks
dataset, marker, hold = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
try:
    with locks.dataset_lock(dataset, "imgest ingest cassandra (lock test)") as holder:
        marker.write_text(holder.who)
        print("WROTE", holder.who, flush=True)
        time.sleep(hold)
except locks.DatasetBusyError as e:
    print("BUSY", e, flush=True)
    sys.exit(3)
"""


def test_hosts_racing_for_one_keyspace_lock_exactly_one_writes(
    cassandra_server: CassandraServer, tmp_path: Path
) -> None:
    keyspace, dataset = f"lockks_{secrets.token_hex(3)}", "imagenet"
    url = cassandra_lock_url(_settings(cassandra_server), keyspace, "SimpleStrategy:1")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMGEST_", "AWS_"))}
    env |= {"IMGEST_LOCK_URL": url, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = []
    for i in range(4):
        (tmp_path / f"host-{i}").mkdir()
        cmd = [sys.executable, "-c", CONTENDER, dataset, str(tmp_path / f"wrote-{i}"), "3"]
        if shutil.which("unshare") and os.geteuid() == 0:
            cmd = ["unshare", "-u", "sh", "-c", f'hostname host-{i} && exec "$@"', "sh", *cmd]
        host_env = {**env, "IMGEST_HOME": str(tmp_path / f"host-{i}")}  # an empty disk of its own
        procs.append(subprocess.Popen(cmd, env=host_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [(p.wait(timeout=180), p.stdout.read() if p.stdout else "") for p in procs]
    winners = [out for rc, out in outs if rc == 0]
    assert len(winners) == 1, outs
    assert len(list(tmp_path.glob("wrote-*"))) == 1
    who = winners[0].split("WROTE ", 1)[1].strip()
    for rc, out in outs:
        if rc != 0:
            assert rc == 3, out
            assert f"is being written by {who}" in out
            assert f"cassandra://{cassandra_server.host}" in out
    assert _keyspace_store(cassandra_server, keyspace).read(dataset) is None  # the winner let go
    assert not list(tmp_path.glob("host-*/locks/*.json"))  # nothing in any host's own lock folder


def test_a_laptop_cli_and_a_cluster_run_writing_one_keyspace_share_its_lock(
    cassandra_server: CassandraServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A DAG run on a cluster (IMGEST_STATE_URL in its bucket) holds the lock of a dataset in the keyspace it writes;
    `imgest ingest cassandra` on a laptop's local master with no state URL, writing the same keyspace, is refused
    naming the run and the keyspace; `imgest locks --keyspace` lists and releases it; then the CLI's own run takes
    the lock there, fences its publishing with it and gives it back."""
    from imgest.cli import main
    from imgest.sources.devdata.sample import SampleSpec, write_sample

    keyspace, dataset = f"lockks_{secrets.token_hex(3)}", f"shared_{secrets.token_hex(2)}"
    monkeypatch.setenv("IMGEST_HOME", str(tmp_path / "laptop"))
    monkeypatch.setenv("IMGEST_STATE_URL", "s3://cluster-state/imgest")  # the cluster's: the tables' lock ignores it
    run_stores = stores_at(str(lock_url_for(None, cassandra_lock_url(_settings(cassandra_server), keyspace))))
    assert [type(s) for s in run_stores] == [CassandraLockStore]
    run = locks.airflow_holder("ingest_imagenet", "scheduled__cluster", lease_s=600)
    locks.acquire(dataset, run, store=run_stores)
    monkeypatch.delenv("IMGEST_STATE_URL")  # the laptop has none
    monkeypatch.delenv("IMGEST_LOCK_URL", raising=False)
    monkeypatch.setenv("IMGEST_CASSANDRA_HOSTS", cassandra_server.host)
    monkeypatch.setenv("IMGEST_CASSANDRA_PORT", str(cassandra_server.native_port))
    write_sample(tmp_path / "src", SampleSpec("imagefolder", classes=2, per_class=2, val_per_class=1, seed=2))
    ingest = ["ingest", "cassandra", str(tmp_path / "src"), "--keyspace", keyspace, "--dataset", dataset]
    ingest += ["--work-dir", str(tmp_path / "work"), "--master", "local[1]", "--write-path", "cql"]
    assert main(ingest) != 0
    err = capsys.readouterr().err
    assert f"dataset {dataset!r} is being written by Airflow DAG ingest_imagenet run scheduled__cluster" in err
    assert f"/{keyspace})" in err  # the store it looked in: the keyspace's
    assert main(["locks", "--keyspace", keyspace]) == 0
    assert "Airflow DAG ingest_imagenet run scheduled__cluster" in capsys.readouterr().out
    assert main(["locks", "release", dataset, "--keyspace", keyspace]) == 0
    assert locks.read(dataset, run_stores.stores[0]) is None
    assert main(ingest) == 0, capsys.readouterr().err  # its driver fenced its version with the keyspace's lock
    with cassandra_session(_settings(cassandra_server)) as session:
        row = session.execute(
            f"SELECT status, writer FROM {keyspace}.dataset_versions WHERE dataset = %s", (dataset,)
        ).one()
        assert row.status == "written"
        assert row.writer.startswith(f"pid {os.getpid()} on ")
        assert locks.read(dataset, run_stores.stores[0]) is None  # given back
        session.execute(f"DROP KEYSPACE {keyspace}", timeout=60)
    assert not (tmp_path / "laptop" / "locks").is_dir() or not list((tmp_path / "laptop" / "locks").iterdir())


def test_a_run_writing_both_targets_holds_both_locks(
    cassandra_server: CassandraServer, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both targets: the keyspace's lock, then the destination's. A shards-only writer holding the destination's
    keeps the run out, and the keyspace's lock it took while waiting is given back; once both are held, a writer of
    either target alone is refused; release frees both."""
    monkeypatch.delenv("IMGEST_STATE_URL", raising=False)
    keyspace, dataset = f"lockks_{secrets.token_hex(3)}", "both"
    dest = f"s3://{s3_server.bucket}/lock-test-{secrets.token_hex(2)}/{dataset}"
    url = lock_url_for(dest, cassandra_lock_url(_settings(cassandra_server), keyspace, "SimpleStrategy:1"))
    assert url is not None
    assert url.startswith("cassandra://")
    assert url.endswith("/_imgest-state")
    both = stores_at(url, s3_server.settings(), _settings(cassandra_server))
    tables, shards = both.stores
    assert isinstance(tables, CassandraLockStore)
    assert isinstance(shards, S3LockStore)
    packer = locks.cli_holder("imgest ingest shards (another laptop)")
    assert locks.try_acquire(dataset, packer, shards) is None
    run = locks.airflow_holder("refresh_both", "scheduled__1", lease_s=600)
    with pytest.raises(locks.DatasetBusyError, match=r"imgest ingest shards .another laptop."):
        locks.acquire(dataset, run, wait=1, poll=0.2, store=both)
    assert locks.read(dataset, tables) is None  # what it took while waiting, given back
    assert locks.release(dataset, packer, shards)
    locks.acquire(dataset, run, store=both)
    for alone in (LockStores([tables]), LockStores([shards])):
        with pytest.raises(locks.DatasetBusyError, match="refresh_both run scheduled__1"):
            locks.acquire(dataset, locks.cli_holder("one target"), store=alone)
    with locks.keep_alive(dataset, run, both):
        locks.check_fence(dataset)  # proven in each store
        assert locks.release(dataset, None, shards)  # by hand, in one of them
        with pytest.raises(locks.LockLostError, match="nobody holds it now"):
            locks.check_fence(dataset)
    assert locks.release(dataset, run, both)
    assert locks.read(dataset, tables) is None
    assert locks.read(dataset, shards) is None
    with cassandra_session(_settings(cassandra_server)) as session:
        session.execute(f"DROP KEYSPACE {keyspace}", timeout=60)
