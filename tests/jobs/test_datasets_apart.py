"""Datasets kept apart in one keyspace: each ingests, verifies and splits on its own rows; a second transform
of a dataset into the same tables is refused unless asked to replace; a complete version stays complete."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from imgest.core.errors import ImgestError
from imgest.core.settings import CassandraSettings
from imgest.services.cassandra import CassandraServer
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sinks.cassandra.schema import TableLayout
from imgest.sinks.cassandra.verify import verify
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.manifest import iter_manifest
from imgest.sources.scan import scan_to_dir
from imgest.splits.sources import from_cassandra
from imgest.splits.split import id_strings
from tests.jobs.conftest import read_summary, run_job

pytestmark = [pytest.mark.services, pytest.mark.slow]
KS = "imgest_test_apart"


@pytest.fixture(scope="module")
def session(cassandra_server: CassandraServer) -> Iterator[Any]:
    with cassandra_session(CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)) as s:
        s.execute(f"DROP KEYSPACE IF EXISTS {KS}", timeout=60)
        yield s


def _ingest(root: Path, name: str, spec: SampleSpec, *extra: str) -> tuple[int, str, Path]:
    manifest = root / name / "manifest"
    if not manifest.exists():
        write_sample(root / name / "src", spec)
        scan_to_dir(root / name / "src", manifest, dataset=name)
    out = root / name / f"summary{len(extra)}.json"
    rc, log = run_job(
        "ingest_cassandra", ["--manifest-dir", str(manifest), "--keyspace", KS, "--summary-json", str(out), *extra]
    )
    return rc, log, out


def _status(session: Any, dataset: str, version: str) -> str:
    row = session.execute(
        f"SELECT status FROM {KS}.dataset_versions WHERE dataset = %s AND version = %s", (dataset, version)
    ).one()
    return row.status


def test_two_datasets_ingest_verify_and_split_apart(tmp_path: Path, session: Any) -> None:
    specs = {
        "alpha": SampleSpec("cls-loc", classes=3, per_class=6, val_per_class=2, seed=1),
        "beta": SampleSpec("imagefolder", classes=4, per_class=5, val_per_class=2, seed=2),
    }
    versions = {}
    for name, spec in specs.items():
        rc, log, out = _ingest(tmp_path, name, spec)
        assert rc == 0, log[-3000:]
        versions[name] = read_summary(out)["version"]
    tables = TableLayout(KS)
    for name in specs:
        manifest = tmp_path / name / "manifest"
        report = verify(session, manifest, tables, name, versions[name], sample=4)
        expected = sum(1 for _ in iter_manifest(manifest / "manifest.parquet"))
        assert report.ok, report.to_dict()
        assert sum(report.found.values()) == expected  # its own rows only, not the other dataset's
        assert _status(session, name, versions[name]) == "complete"
        rows = from_cassandra(session, f"{KS}.metadata", f"{KS}.data", "train", dataset=name)
        train = {c.id for c in iter_manifest(manifest / "manifest.parquet") if c.split == "train"}
        assert set(id_strings(rows.ids).tolist()) == train
        assert rows.num_classes == specs[name].classes  # its own class map
        assert rows.source["version"] == versions[name]
    with pytest.raises(ImgestError, match="holds datasets alpha, beta"):
        from_cassandra(session, f"{KS}.metadata", f"{KS}.data", "train")

    # a second transform of alpha into the same tables: refused, alpha stays complete and readable
    rc, log, _ = _ingest(tmp_path, "alpha", specs["alpha"], "--resize", "128", "--crop", "112")
    assert rc != 0
    assert "--table-suffix" in log
    assert "--replace-version" in log
    assert _status(session, "alpha", versions["alpha"]) == "complete"
    assert verify(session, tmp_path / "alpha" / "manifest", tables, "alpha", versions["alpha"], sample=4).ok

    # re-running the complete version keeps it complete (never back to writing)
    rc, log, out = _ingest(tmp_path, "alpha", specs["alpha"], "--version", versions["alpha"])
    assert rc == 0, log[-3000:]
    assert read_summary(out)["stored"] == 0
    assert _status(session, "alpha", versions["alpha"]) == "complete"

    # asked to replace: the new version takes the rows, the old one is marked replaced; beta is untouched
    rc, log, out = _ingest(tmp_path, "alpha", specs["alpha"], "--resize", "128", "--crop", "112", "--replace-version")
    assert rc == 0, log[-3000:]
    new = read_summary(out)["version"]
    assert new != versions["alpha"]
    assert _status(session, "alpha", versions["alpha"]) == "replaced"
    assert verify(session, tmp_path / "alpha" / "manifest", tables, "alpha", new, sample=4).ok
    assert not verify(session, tmp_path / "alpha" / "manifest", tables, "alpha", versions["alpha"], sample=2).ok
    assert verify(session, tmp_path / "beta" / "manifest", tables, "beta", versions["beta"], sample=2).ok
