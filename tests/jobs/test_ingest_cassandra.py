"""The Cassandra ingest job end to end: real spark-submit (local master) against the real local node."""

from __future__ import annotations

import io
import pickle
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from imgest.cli import main
from imgest.core.settings import CassandraSettings
from imgest.services.cassandra import CassandraServer
from imgest.sinks.cassandra import compaction_hold
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sinks.cassandra.schema import TableLayout
from imgest.sinks.cassandra.verify import verify
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.manifest import iter_manifest, manifest_metadata, write_manifest
from imgest.sources.read import read_candidate
from imgest.sources.scan import scan_to_dir
from imgest.spark.submit import submit_command, submit_env
from imgest.splits.split import load_split
from imgest.transform.image import TransformSpec, transform_image
from tests.jobs.conftest import MASTER, kill_when, read_summary, run_job

pytestmark = [pytest.mark.services, pytest.mark.slow]


@pytest.fixture(scope="module")
def session(cassandra_server: CassandraServer) -> Iterator[Any]:
    with cassandra_session(CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)) as s:
        yield s


def _dataset(root: Path, spec: SampleSpec) -> Path:
    write_sample(root / "src", spec)
    scan_to_dir(root / "src", root / "manifest")
    return root / "manifest"


def _drop(session: Any, keyspace: str) -> None:
    session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)


def cassandra_data(session: Any) -> Path:
    """The node's data folder (the test node is local)."""
    row = session.execute("SELECT value FROM system_views.settings WHERE name = 'data_file_directories'").one()
    return Path(row.value.strip("[]").split(",")[0])


def _sstable_formats(data: Path, keyspace: str) -> set[str]:
    """The SSTable format versions (nb, oa, ...) of KEYSPACE's files: a node in CASSANDRA_4 compatibility mode (5.0's
    default) refuses to start with another version than its own, so the bulk loader must write the node's."""
    return {f.name.split("-")[0] for f in data.glob(f"{keyspace}/*/*-Data.db")}


def _held(session: Any, keyspace: str) -> list[str]:
    """Tables of KEYSPACE whose compaction a bulk load holds (off, with imgest's mark)."""
    rows = session.execute(
        "SELECT table_name, compaction, comment FROM system_schema.tables WHERE keyspace_name = %s", (keyspace,)
    )
    held = [r for r in rows if compaction_hold.holder_of(r.comment or "") is not None]
    assert all(dict(r.compaction).get("enabled") == "false" for r in held)
    return sorted(f"{keyspace}.{r.table_name}" for r in held)


def _count(session: Any, table: str) -> int:
    return session.execute(f"SELECT count(*) FROM {table}").one()[0]


@pytest.mark.parametrize("path", ["cql", "bulk", "cql-helper"])
def test_labels_and_bytes_round_trip_then_rerun_without_duplicates(tmp_path: Path, session: Any, path: str) -> None:
    ks = f"imgest_test_job_roundtrip_{path.replace('-', '_')}"
    _drop(session, ks)
    manifest = _dataset(tmp_path, SampleSpec("cls-loc", classes=3, per_class=8, val_per_class=3, seed=7, defects=True))
    out = tmp_path / "first.json"
    args = ["--manifest-dir", str(manifest), "--keyspace", ks, "--write-path", path]
    rc, log = run_job("ingest_cassandra", [*args, "--summary-json", str(out)])
    assert rc == 0, log[-3000:]
    first = read_summary(out)
    assert first["write_path"]["path"] == path
    loaded = sorted({f"{ks}.data", f"{ks}.metadata"})
    assert first["compaction_held"] == (loaded if path == "bulk" else [])
    assert _held(session, ks) == []  # given back once the load ended
    formats, node = _sstable_formats(cassandra_data(session), ks), _sstable_formats(cassandra_data(session), "system")
    assert formats <= node, (formats, node)  # the node's own format: it starts again with these files
    assert formats or path != "bulk"  # the loaded SSTables are on disk (CQL rows may still be in memtables)
    rows = list(iter_manifest(manifest / "manifest.parquet"))
    assert first["quarantined_by_reason"] == {
        "corrupt": 2,
        "empty": 1,
        "no-label": 1,
        "not-an-image": 1,
        "too-large": 1,
    }
    assert first["stored"] == len(rows) - 5
    assert first["candidates"] == len(rows) + 1

    root = Path(manifest_metadata(manifest / "manifest.parquet")["root"])
    quarantined = {r.id for r in session.execute(f"SELECT id FROM {ks}.quarantine")}
    assert len(quarantined) == 6
    for cand in rows:
        key = (uuid.UUID(cand.id),)
        row = session.execute(f"SELECT label, data FROM {ks}.data WHERE id = %s", key).one()
        if key[0] in quarantined:
            assert row is None
            continue
        assert row.label == cand.label
        assert bytes(row.data) == transform_image(read_candidate(root, cand), TransformSpec()).data
        meta = session.execute(f"SELECT split, rel_path, wnid FROM {ks}.metadata WHERE id = %s", key).one()
        assert (meta.split, meta.rel_path, meta.wnid) == (cand.split, cand.rel_path, cand.wnid)

    again = tmp_path / "second.json"
    rc, log = run_job("ingest_cassandra", [*args, "--summary-json", str(again)])
    assert rc == 0, log[-3000:]
    second = read_summary(again)
    assert second["stored"] == 0
    assert second["skipped_already_committed"] == first["stored"]
    assert _count(session, f"{ks}.data") == first["stored"]
    assert _count(session, f"{ks}.metadata") == first["stored"]

    report = verify(session, manifest, TableLayout(ks), None, first["version"], sample=10)
    assert report.ok, report.to_dict()
    assert session.execute(f"SELECT status FROM {ks}.dataset_versions").one().status == "complete"

    # split files from the rows the job wrote: from the database, then from the metadata cache
    tables = ["--metadata-table", f"{ks}.metadata", "--data-table", f"{ks}.data", "--split-of", "train"]
    cache, a, b = tmp_path / "meta.parquet", tmp_path / "a.npz", tmp_path / "b.npz"
    assert (
        main(
            [
                "split",
                *tables,
                "-r",
                "8,2",
                "--seed",
                "3",
                "-o",
                str(a),
                "--metadata-ofn",
                str(cache),
                "--format",
                "crs4",
            ]
        )
        == 0
    )
    assert main(["split", "--metadata-ifn", str(cache), "-r", "8,2", "--seed", "3", "-o", str(b)]) == 0
    split_a, split_b = load_split(a), load_split(b)
    train_ids = {str(r.id) for r in session.execute(f"SELECT id, split FROM {ks}.metadata") if r.split == "train"}
    assert set(split_a.row_ids.tolist()) == train_ids
    assert all(np.array_equal(x, y) for x, y in zip(split_a.parts, split_b.parts, strict=True))
    assert split_a.num_classes == 3
    with open(a.with_suffix(".pckl"), "rb") as fh:
        crs4 = pickle.load(fh)
    assert crs4["data_table"] == f"{ks}.data"
    assert sorted(str(k) for k in crs4["row_keys"]) == sorted(train_ids)


@pytest.mark.parametrize("path", ["cql", "bulk", "cql-helper"])
def test_resume_after_job_killed_midway(tmp_path: Path, session: Any, path: str) -> None:
    """Killed mid-way (the helper with it: same process group), then re-run: every row once, verified."""
    ks = f"imgest_test_job_resume_{path.replace('-', '_')}"
    _drop(session, ks)
    manifest = _dataset(tmp_path, SampleSpec("imagefolder", classes=4, per_class=50, val_per_class=0, seed=8))
    total = sum(1 for _ in iter_manifest(manifest / "manifest.parquet"))
    args = ["--manifest-dir", str(manifest), "--keyspace", ks, "--partitions", "25", "--max-in-flight", "1"]
    args += ["--write-path", path]
    proc = subprocess.Popen(
        submit_command("ingest_cassandra", args, "local[1]"),
        env=submit_env(MASTER),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def committed() -> int:
        try:
            return _count(session, f"{ks}.metadata")
        except Exception:  # the table does not exist yet
            return 0

    written = kill_when(proc, committed, lambda n: n >= 20)
    assert 0 < written < total, f"kill did not land mid-way ({written}/{total})"
    assert session.execute(f"SELECT status FROM {ks}.dataset_versions").one().status == "writing"
    loaded = sorted({f"{ks}.data", f"{ks}.metadata"})
    assert _held(session, ks) == (loaded if path == "bulk" else [])  # killed: nobody gave compaction back

    out = tmp_path / "resumed.json"
    rc, log = run_job("ingest_cassandra", [*args, "--summary-json", str(out)])
    assert rc == 0, log[-3000:]
    resumed = read_summary(out)
    assert resumed["write_path"]["path"] == path
    assert resumed["compaction_held"] == (loaded if path == "bulk" else [])
    assert _held(session, ks) == []
    already = resumed["skipped_already_committed"]
    assert already >= written
    assert resumed["stored"] + already == total
    assert _count(session, f"{ks}.data") == total
    assert verify(session, manifest, TableLayout(ks), None, resumed["version"], sample=5).ok


def _noise_png(path: Path, width: int, height: int) -> int:
    rng = np.random.default_rng(1)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buf, "PNG", compress_level=1)
    path.write_bytes(buf.getvalue())
    return len(buf.getvalue())


def test_15mb_unchanged_image_stored_and_oversized_quarantined(tmp_path: Path, session: Any) -> None:
    ks = "imgest_test_job_unchanged"
    _drop(session, ks)
    cls = tmp_path / "src" / "train" / "n00000001"
    cls.mkdir(parents=True)
    big = _noise_png(cls / "big.png", 2300, 2200)
    huge = _noise_png(cls / "huge.png", 3900, 3500)
    assert 15_000_000 < big < 16_500_000
    assert huge > 32 * 1024 * 1024
    scan_to_dir(tmp_path / "src", tmp_path / "manifest")
    out = tmp_path / "s.json"
    args = ["--manifest-dir", str(tmp_path / "manifest"), "--keyspace", ks, "--mode", "unchanged"]
    rc, log = run_job("ingest_cassandra", [*args, "--table-suffix", "_orig", "--summary-json", str(out)])
    assert rc == 0, log[-3000:]
    summary = read_summary(out)
    assert summary["stored"] == 1
    assert summary["quarantined_by_reason"] == {"too-large-for-store": 1}
    rows = list(iter_manifest(tmp_path / "manifest" / "manifest.parquet"))
    (cand,) = [c for c in rows if c.rel_path.endswith("big.png")]
    row = session.execute(f"SELECT data FROM {ks}.data_orig WHERE id = %s", (uuid.UUID(cand.id),)).one()
    assert bytes(row.data) == (cls / "big.png").read_bytes()
    entry = session.execute(f"SELECT rel_path, reason FROM {ks}.quarantine").one()
    assert (entry.rel_path, entry.reason) == ("train/n00000001/huge.png", "too-large-for-store")


def test_a_manifest_out_of_order_goes_through_sparks_range_partitioning(tmp_path: Path, session: Any) -> None:
    """A manifest not in (container, offset, rel_path) order (written by hand) is spread by Spark SQL's range
    repartition (the job's context makes a SparkSession for it on first use); every row is stored once."""
    ks = "imgest_test_job_unordered"
    _drop(session, ks)
    manifest = _dataset(tmp_path, SampleSpec("imagefolder", classes=2, per_class=6, val_per_class=0, seed=4))
    path = manifest / "manifest.parquet"
    rows = list(iter_manifest(path))
    write_manifest(list(reversed(rows)), path, manifest_metadata(path))
    out = tmp_path / "s.json"
    rc, log = run_job(
        "ingest_cassandra", ["--manifest-dir", str(manifest), "--keyspace", ks, "--summary-json", str(out)]
    )
    assert rc == 0, log[-3000:]
    assert "is not in ('container', 'offset', 'rel_path') order: Spark range-partitions it" in log
    assert read_summary(out)["stored"] == len(rows)
    assert {str(r.id) for r in session.execute(f"SELECT id FROM {ks}.metadata")} == {c.id for c in rows}


def test_wrong_password_fails_fast_without_leaking_it(tmp_path: Path, cassandra_auth_server: CassandraServer) -> None:
    manifest = _dataset(tmp_path, SampleSpec("imagefolder", classes=2, per_class=1, val_per_class=0, seed=9))
    secret = "Wr0ng-Pa55-zq"
    port = cassandra_auth_server.native_port
    rc, log = run_job(
        "ingest_cassandra",
        ["--manifest-dir", str(manifest), "--keyspace", "imgest_test_auth", "--port", str(port)],
        env={"IMGEST_CASSANDRA_USER": "cassandra", "IMGEST_CASSANDRA_PASSWORD": secret},
    )
    assert rc != 0
    assert f"Cassandra at 127.0.0.1:{port} refused the credentials of user 'cassandra'" in log
    assert secret not in log
    assert "ingesting" not in log  # failed before any Spark work started


@pytest.mark.parametrize("path", ["bulk", "cql-helper"])
def test_helper_paths_with_credentials_keep_them_out_of_argv(
    tmp_path: Path, cassandra_auth_server: CassandraServer, path: str
) -> None:
    """The helper reads the ring (bulk) or sends its rows (cql-helper) through an authenticated session; the password
    travels on its stdin, never in a command line or the log, and the rows land on the node (counted through an
    authenticated session)."""
    manifest = _dataset(tmp_path, SampleSpec("imagefolder", classes=2, per_class=6, val_per_class=0, seed=9))
    ks, port, secret = f"imgest_test_auth_{path.replace('-', '_')}", cassandra_auth_server.native_port, "cassandra"
    settings = CassandraSettings(hosts=("127.0.0.1",), port=port, username="cassandra", password=secret)
    with cassandra_session(settings) as s:
        _drop(s, ks)
    out = tmp_path / "bulk.json"
    args = ["--manifest-dir", str(manifest), "--keyspace", ks, "--port", str(port), "--write-path", path]
    rc, log = run_job(
        "ingest_cassandra",
        [*args, "--summary-json", str(out)],
        env={"IMGEST_CASSANDRA_USER": "cassandra", "IMGEST_CASSANDRA_PASSWORD": secret},
    )
    assert rc == 0, log[-3000:]
    summary = read_summary(out)
    assert summary["write_path"]["path"] == path
    assert summary["stored"] == 12
    assert f"--password {secret}" not in log
    with cassandra_session(settings) as s:
        assert _count(s, f"{ks}.data") == 12
        assert _count(s, f"{ks}.metadata") == 12
        report = verify(s, manifest, TableLayout(ks), None, summary["version"], sample=12)
    assert report.ok, report.to_dict()
