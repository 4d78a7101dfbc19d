"""The Cassandra target's publishing is fenced by the dataset lock: a holder whose lease ran out and was taken over
neither records its version's counts nor completes it; the version record stays as the loss found it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from imgest.core import locks
from imgest.core.lock_stores import FileLockStore
from imgest.core.settings import CassandraSettings
from imgest.services.cassandra import CassandraServer
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sinks.cassandra.ingest import CassandraIngestConfig, begin_version, finish_version, ingest_partition
from imgest.sinks.cassandra.schema import TableLayout
from imgest.sinks.cassandra.verify import verify
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.manifest import iter_manifest, manifest_metadata
from imgest.sources.scan import scan_to_dir
from imgest.transform.image import TransformSpec
from tests.lock_wait import take_over

pytestmark = pytest.mark.services
TABLES = TableLayout("imgest_test_fence")


def _record(session: object, version: str) -> tuple[str, object]:
    row = session.execute(  # type: ignore[attr-defined]
        f"SELECT status, finished_at FROM {TABLES.keyspace}.dataset_versions WHERE dataset = %s AND version = %s",
        ("fenced", version),
    ).one()
    return row.status, row.finished_at


def test_a_taken_over_holder_neither_records_nor_completes(cassandra_server: CassandraServer, tmp_path: Path) -> None:
    write_sample(tmp_path / "src", SampleSpec("cls-loc", classes=2, per_class=3, val_per_class=1, seed=9))
    manifest = tmp_path / "manifest"
    scan_to_dir(tmp_path / "src", manifest, dataset="fenced")
    root = manifest_metadata(manifest / "manifest.parquet")["root"]
    settings = CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)
    store = FileLockStore(tmp_path / "locks")
    first = locks.cli_holder("imgest ingest cassandra", lease_s=0.5)
    assert locks.try_acquire("fenced", first, store) is None
    cfgs = [  # v2 in tables of its own
        CassandraIngestConfig(root, "fenced", v, tables, TransformSpec(), (cassandra_server.host,), settings.port)
        for v, tables in (("v1", TABLES), ("v2", replace(TABLES, suffix="_v2")))
    ]
    with cassandra_session(settings) as session, locks.holding("fenced", first, store):
        session.execute(f"DROP KEYSPACE IF EXISTS {TABLES.keyspace}", timeout=60)
        for cfg in cfgs:  # both claimed and written while the lock is held
            begin_version(session, cfg, ["train", "val"], "SimpleStrategy:1")
            total = ingest_partition(iter_manifest(manifest / "manifest.parquet"), cfg)
        finish_version(session, cfgs[0], total, ["n0", "n1"])
        written = _record(session, "v1")
        second = locks.airflow_holder("ingest_imagenet", "manual__second", lease_s=600)
        take_over("fenced", second, store)  # the holder stalls past its lease; another run takes the lock over
        with pytest.raises(locks.LockLostError, match="held by Airflow DAG ingest_imagenet run manual__second"):
            verify(session, manifest, TABLES, "fenced", "v1", sample=2)  # matches, but may not complete it
        with pytest.raises(locks.LockLostError):
            finish_version(session, cfgs[1], total, ["n0", "n1"])
        assert _record(session, "v1") == written
        assert written[0] == "written"
        assert _record(session, "v2") == ("writing", None)  # no counts, no finish recorded


def test_the_version_record_names_its_writer_and_a_zombie_advances_nothing(
    cassandra_server: CassandraServer, tmp_path: Path
) -> None:
    """The LWT that advances a version names its writer: run A claimed v1, then lost the lock to run B, which claimed
    v1 again; A (past its fence: a zombie in the window between its fence and its write) changes nothing. A later
    holder of the lock (a CLI verify of B's version once B is gone) takes the record over and completes it."""
    from imgest.sinks.cassandra.schema import apply_schema
    from imgest.sinks.cassandra.versions import advance_status, claim_version

    settings = CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)
    store = FileLockStore(tmp_path / "locks")
    a = locks.airflow_holder("ingest_imagenet", "manual__a", lease_s=0.3)
    b = locks.airflow_holder("ingest_imagenet", "manual__b", lease_s=0.3)
    tables = replace(TABLES, suffix="_writer")
    ks, tabs = tables.keyspace, tables.tables(["train"])
    with cassandra_session(settings) as session:
        apply_schema(session, tables, ["train"], "SimpleStrategy:1")
        session.execute(f"DELETE FROM {ks}.dataset_versions WHERE dataset = 'zombie'")
        assert locks.try_acquire("zombie", a, store) is None
        with locks.holding("zombie", a, store):
            claim_version(session, ks, "zombie", "v1", tabs, "{}")
        take_over("zombie", b, store)  # A stalls past its lease; B takes the lock and claims the version
        with locks.holding("zombie", b, store):
            claim_version(session, ks, "zombie", "v1", tabs, "{}")
        with locks.holding("zombie", a, store), pytest.raises(locks.LockLostError, match="manual__b"):
            advance_status(session, ks, "zombie", "v1", "written", ("writing",))
        row = session.execute(f"SELECT status, writer FROM {ks}.dataset_versions WHERE dataset = 'zombie'").one()
        assert (row.status, row.writer) == ("writing", b.who)
        with locks.holding("zombie", b, store):
            assert advance_status(session, ks, "zombie", "v1", "written", ("writing",))
        cli = locks.cli_holder("imgest verify cassandra", lease_s=600)
        take_over("zombie", cli, store)  # B is gone; a CLI verify takes the lock and completes B's version
        with locks.holding("zombie", cli, store):
            assert advance_status(session, ks, "zombie", "v1", "complete", ("written",))
        row = session.execute(f"SELECT status, writer FROM {ks}.dataset_versions WHERE dataset = 'zombie'").one()
        assert (row.status, row.writer) == ("complete", cli.who)


def test_the_version_record_names_the_epoch_and_an_older_epoch_of_the_run_advances_nothing(
    cassandra_server: CassandraServer,
) -> None:
    """The writer the version record's LWT names carries the lock's epoch: run R claimed v1 under its first epoch;
    the lock was released by hand and R took it again (a new epoch, in the keyspace's own lock store), and claimed v1
    again; a process of R's first epoch (past its fence: a zombie in the window between its fence and its write)
    changes nothing, though it is the same run; the new epoch's process advances it."""
    from imgest.core.lock_stores import cassandra_lock_url
    from imgest.sinks.cassandra.lock_store import CassandraLockStore
    from imgest.sinks.cassandra.schema import apply_schema
    from imgest.sinks.cassandra.versions import advance_status, claim_version

    settings = CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)
    tables = replace(TABLES, suffix="_epoch")
    ks, tabs = tables.keyspace, tables.tables(["train"])
    store = CassandraLockStore(cassandra_lock_url(settings, ks), settings)
    run = locks.airflow_holder("ingest_imagenet", "manual__r", lease_s=600)
    with cassandra_session(settings) as session:
        apply_schema(session, tables, ["train"], "SimpleStrategy:1")
        session.execute(f"DELETE FROM {ks}.dataset_versions WHERE dataset = 'epochs'")
        locks.release("epochs", None, store)
        assert locks.try_acquire("epochs", run, store) is None
        first = locks.learn_epoch("epochs", run, store)
        with locks.holding("epochs", run, store, epoch=first):
            claim_version(session, ks, "epochs", "v1", tabs, "{}")
        assert locks.release("epochs", None, store)  # by hand
        assert locks.try_acquire("epochs", run, store) is None  # R's lock task, retried
        second = locks.learn_epoch("epochs", run, store)
        assert second not in (None, first)
        with locks.holding("epochs", run, store, epoch=second):
            claim_version(session, ks, "epochs", "v1", tabs, "{}")
        with (
            locks.holding("epochs", run, store, epoch=first),
            pytest.raises(locks.LockLostError, match=f"taken again since .epoch {second}"),
        ):
            advance_status(session, ks, "epochs", "v1", "written", ("writing",))
        row = session.execute(f"SELECT status, writer FROM {ks}.dataset_versions WHERE dataset = 'epochs'").one()
        assert (row.status, row.writer) == ("writing", f"{run.who} epoch {second}")
        with locks.holding("epochs", run, store, epoch=second):
            assert advance_status(session, ks, "epochs", "v1", "written", ("writing",))
        assert locks.release("epochs", run, store)
