"""verify against the real node: recorded counts, the token-range count, the byte-equal sample, and the faults
each one catches (a missing row, a corrupted blob, a job summary that disagrees). The rows are written by the
job's own partition code (ingest_partition) in this process, without Spark."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from imgest.cli import main
from imgest.core.settings import CassandraSettings
from imgest.services.cassandra import CassandraServer
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sinks.cassandra.ingest import CassandraIngestConfig, begin_version, finish_version, ingest_partition
from imgest.sinks.cassandra.schema import TableLayout
from imgest.sinks.cassandra.verify import expected_counts, verify
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.manifest import iter_manifest, manifest_metadata, read_classes
from imgest.sources.scan import scan_to_dir
from imgest.transform.image import TransformSpec

pytestmark = pytest.mark.services
TABLES = TableLayout("imgest_test_verify")
CLASSES = 4
VERSION = "v1"


@pytest.fixture(scope="module")
def ingested(cassandra_server: CassandraServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """(session, manifest folder) of a sample dataset written into TABLES as the job's partitions write it."""
    root = tmp_path_factory.mktemp("verify")
    write_sample(root / "src", SampleSpec("cls-loc", classes=CLASSES, per_class=6, val_per_class=2, seed=4))
    scan_to_dir(root / "src", root / "manifest")
    manifest = root / "manifest"
    meta = manifest_metadata(manifest / "manifest.parquet")
    settings = CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)
    cfg = CassandraIngestConfig(
        meta["root"], meta["dataset"], VERSION, TABLES, TransformSpec(), port=cassandra_server.native_port
    )
    with cassandra_session(settings) as session:
        session.execute(f"DROP KEYSPACE IF EXISTS {TABLES.keyspace}", timeout=60)
        begin_version(session, cfg, ["train", "val"], "SimpleStrategy:1")
        total = ingest_partition(iter_manifest(manifest / "manifest.parquet"), cfg)
        finish_version(session, cfg, total, [c.wnid for c in read_classes(manifest / "classes.json")])
        yield session, manifest


def _candidates(manifest: Path) -> list[Any]:
    return list(iter_manifest(manifest / "manifest.parquet"))


def test_recorded_counts_and_sample_verify_and_complete(ingested: tuple[Any, Path]) -> None:
    session, manifest = ingested
    rows = _candidates(manifest)
    report = verify(session, manifest, TABLES, None, VERSION, sample=8, job_rows=len(rows))
    assert report.ok, report.to_dict()
    assert report.counts_from == "recorded"  # no table scan: the counts the job recorded
    assert report.found == dict(Counter(f"{c.split}/{c.label}" for c in rows))
    assert report.sampled == 8
    status = session.execute(f"SELECT status FROM {TABLES.keyspace}.dataset_versions").one().status
    assert status == "complete"
    counted = verify(session, manifest, TABLES, None, VERSION, sample=0, count_rows=True, mark_complete=False)
    assert counted.ok, counted.to_dict()
    assert (counted.counts_from, counted.found) == ("table", report.found)  # the token-range count agrees


def test_cli_counts_rows_in_the_table_when_asked(ingested: tuple[Any, Path], capsys: pytest.CaptureFixture) -> None:
    session, manifest = ingested
    port = str(session.cluster.port)
    args = ["verify", "cassandra", str(manifest), "--keyspace", TABLES.keyspace, "--version", VERSION]
    assert main([*args, "--port", port, "--sample", "2", "--count-rows"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out[: out.rindex("}") + 1])["counts_from"] == "table"
    assert f"verified: {len(_candidates(manifest))} rows (table) match the manifest" in out


def test_sample_is_seeded_and_class_balanced(ingested: tuple[Any, Path]) -> None:
    _, manifest = ingested
    path = manifest / "manifest.parquet"
    expected, picked = expected_counts(path, set(), CLASSES, seed=1)
    assert sorted(c.label for c in picked) == list(range(CLASSES))  # one of each class
    assert [c.id for c in expected_counts(path, set(), CLASSES, seed=1)[1]] == [c.id for c in picked]
    assert [c.id for c in expected_counts(path, set(), CLASSES, seed=2)[1]] != [c.id for c in picked]
    _, two_each = expected_counts(path, set(), 2 * CLASSES, seed=1)
    assert Counter(c.label for c in two_each) == dict.fromkeys(range(CLASSES), 2)
    skipped = picked[0].id
    counts, again = expected_counts(path, {skipped}, 100, seed=1)
    assert skipped not in {c.id for c in again}  # quarantined rows are neither counted nor sampled
    assert sum(counts.values()) == sum(expected.values()) - 1
    assert len(again) == sum(counts.values())  # a sample larger than the data takes every row once


def test_missing_row_corrupt_blob_and_job_mismatch_are_caught(ingested: tuple[Any, Path]) -> None:
    session, manifest = ingested
    ks = TABLES.keyspace
    rows = sorted(_candidates(manifest), key=lambda c: c.id)
    gone, corrupt, no_data = rows[0], rows[1], rows[2]
    session.execute(f"DELETE FROM {ks}.metadata WHERE id = %s", (uuid.UUID(gone.id),))
    session.execute(f"DELETE FROM {ks}.data WHERE id = %s", (uuid.UUID(gone.id),))
    session.execute(f"UPDATE {ks}.data SET data = %s WHERE id = %s", (b"\xff\xd8 not the image", uuid.UUID(corrupt.id)))
    session.execute(f"DELETE FROM {ks}.data WHERE id = %s", (uuid.UUID(no_data.id),))

    # the token-range count sees the missing row; the sample (every row here) sees each fault by name
    report = verify(session, manifest, TABLES, None, VERSION, sample=len(rows), count_rows=True, mark_complete=False)
    key = f"{gone.split}/{gone.label}"
    expected = sum(1 for c in rows if f"{c.split}/{c.label}" == key)
    assert not report.ok
    assert report.counts_from == "table"
    assert report.count_mismatches == {key: (expected, expected - 1)}
    assert report.byte_mismatches == [corrupt.rel_path]
    assert sorted(report.missing) == sorted([gone.rel_path, no_data.rel_path])

    # recorded counts alone do not see a row deleted after the job: that is what count_rows is for
    recorded = verify(session, manifest, TABLES, None, VERSION, sample=0, mark_complete=False, job_rows=len(rows) + 1)
    assert recorded.counts_from == "recorded"
    assert recorded.count_mismatches == {"job": (len(rows) + 1, len(rows))}  # the job summary disagrees
    assert json.loads(json.dumps(recorded.to_dict()))["count_mismatches"]["job"] == {
        "expected": len(rows) + 1,
        "found": len(rows),
    }


def test_a_rerun_looks_up_committed_rows_and_a_fresh_version_does_not(
    ingested: tuple[Any, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lookup before writing serves reruns (every committed row skipped); a version no run claimed yet skips the
    lookup and writes every row (here the same rows again: same ids, same bytes, nothing duplicated)."""
    import imgest.sinks.cassandra.ingest as ingest

    session, manifest = ingested
    rows = _candidates(manifest)
    meta = manifest_metadata(manifest / "manifest.parquet")
    port = session.cluster.port
    lookups: list[int] = []
    real = ingest.committed
    monkeypatch.setattr(ingest, "committed", lambda *a, **k: lookups.append(1) or real(*a, **k))
    cfg = CassandraIngestConfig(meta["root"], meta["dataset"], VERSION, TABLES, TransformSpec(), port=port)
    rerun = ingest_partition(iter(rows), cfg)  # rows an earlier test deleted are written again, the rest skipped
    good = len(rows) - len(rerun.quarantine)
    assert lookups
    assert rerun.stored + rerun.skipped == good
    assert rerun.skipped >= good - 3
    lookups.clear()
    fresh = ingest_partition(iter(rows), CassandraIngestConfig(**{**cfg.__dict__, "fresh": True}))
    assert not lookups
    assert (fresh.stored, fresh.skipped) == (good, 0)
    assert sum(1 for _ in session.execute(f"SELECT id FROM {TABLES.keyspace}.data")) == good  # nothing duplicated
