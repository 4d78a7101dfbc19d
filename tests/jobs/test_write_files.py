"""The files job (real spark-submit, local master) with several partitions: the merged samples.parquet, versioned
publishing with the manifest as the only commit, the collector and the verifier on what the job wrote."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from imgest.cli import main as cli
from imgest.core.quarantine import QuarantineLog
from imgest.readback.datasets import files_set
from imgest.sinks.files.layout import data_root, read_manifest
from imgest.sinks.files.verify import verify_files
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.manifest import iter_manifest
from imgest.sources.scan import scan_to_dir
from tests.jobs.conftest import read_summary, run_job

pytestmark = [pytest.mark.services, pytest.mark.slow]


@pytest.fixture(scope="module")
def scanned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("filesjob")
    write_sample(
        root / "src", SampleSpec("imagefolder", classes=4, per_class=15, val_per_class=3, seed=7, defects=True)
    )
    scan_to_dir(root / "src", root / "m")
    return root / "m"


def _write(manifest_dir: Path, dest: Path, summary: Path, *extra: str) -> tuple[int, str]:
    args = ["--manifest-dir", str(manifest_dir), "--dest", str(dest), "--partitions", "5"]
    return run_job("write_files", [*args, "--summary-json", str(summary), *extra])


def _tree(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def test_several_partitions_give_one_sorted_samples_table_in_a_version_folder(scanned: Path, tmp_path: Path) -> None:
    dest, summary = tmp_path / "files", tmp_path / "s.json"
    rc, out = _write(scanned, dest, summary)
    assert rc == 0, out[-3000:]
    doc, written = read_manifest(dest), read_summary(summary)
    folder = dest / doc["root"]
    assert doc["root"].startswith("v/")
    assert written["root"] == doc["root"]
    assert data_root(dest) == folder
    table = pq.read_table(folder / "samples.parquet")
    paths = table.column("path").to_pylist()
    assert paths == sorted(paths)  # five partitions, merged in path order
    rows = sum(1 for _ in iter_manifest(scanned / "manifest.parquet"))
    by_job = doc["quarantine"]["count"] - len(QuarantineLog.read(scanned / "quarantine.json").entries)
    assert len(paths) == sum(doc["samples"].values()) == written["published"]
    assert len(paths) + by_job == rows  # every manifest row is a file or a quarantine entry from a partition
    assert by_job == 5  # the sample plants broken images: the partitions' quarantine entries reach the manifest
    assert sorted(table.column("id").to_pylist()) == sorted(set(table.column("id").to_pylist()))
    for path, sha, size in zip(
        paths, table.column("sha256").to_pylist(), table.column("bytes").to_pylist(), strict=True
    ):
        data = (folder / path).read_bytes()
        assert (hashlib.sha256(data).hexdigest(), len(data)) == (sha, size)
    assert _tree(folder) == {*paths, "samples.parquet", "manifest.json"}  # nothing stray, no .partial
    assert sorted(p.name for p in dest.iterdir()) == ["manifest.json", "v"]  # staging and parts are gone
    assert json.loads((folder / "manifest.json").read_text())["samples"] == doc["samples"]


def test_a_new_version_is_visible_only_once_the_manifest_switches_then_gc_removes_the_old(
    scanned: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "files"
    rc, out = _write(scanned, dest, tmp_path / "1.json")
    assert rc == 0, out[-3000:]
    first = read_manifest(dest)["root"]
    old = files_set(dest, None)

    # A real fault after the version folder was renamed: the manifest cannot be replaced.
    (dest / "manifest.json.partial").mkdir()
    rc, out = _write(scanned, dest, tmp_path / "2.json", "--quality", "70")
    assert rc != 0
    assert read_manifest(dest)["root"] == first  # readers still get the previous version, whole
    assert verify_files(dest, sample=0).ok
    assert files_set(dest, None).root == old.root
    staged = [p for p in (dest / "v").iterdir() if p.name != first[2:]]
    assert len(staged) == 1  # the new version is in place, named by no manifest yet

    (dest / "manifest.json.partial").rmdir()
    rc, out = _write(scanned, dest, tmp_path / "2.json", "--quality", "70")
    assert rc == 0, out[-3000:]
    doc = read_manifest(dest)
    assert doc["root"] == f"v/{staged[0].name}"  # the same scan and settings: the same key, replaced cleanly
    assert doc["history"] == [first]
    assert doc["transform"]["quality"] == 70
    assert all(Path(p).is_file() for p in old.paths)  # the old version stays until collected
    assert verify_files(dest).ok

    assert cli(["gc", "files", str(dest), "--dry-run"]) == 0
    assert (dest / first).is_dir()  # --keep 1 by default: the previous version stays
    assert cli(["gc", "files", str(dest), "--keep", "0"]) == 0
    assert [p.name for p in (dest / "v").iterdir()] == [staged[0].name]
    assert not (dest / "_staging").exists()
    assert cli(["verify", "files", str(dest)]) == 0


def test_verify_of_the_job_output_finds_what_was_changed(scanned: Path, tmp_path: Path) -> None:
    dest = tmp_path / "files"
    rc, out = _write(scanned, dest, tmp_path / "s.json")
    assert rc == 0, out[-3000:]
    copy = tmp_path / "copy"
    shutil.copytree(dest, copy)
    folder = data_root(copy)
    paths = pq.read_table(folder / "samples.parquet").column("path").to_pylist()
    (folder / paths[0]).unlink()
    (folder / paths[1]).write_bytes(b"short")
    report = verify_files(copy, sample=2)
    assert report.missing == [paths[0]]
    assert [m["path"] for m in report.size_mismatches] == [paths[1]]
    assert report.to_dict()["sample"] == 2
    assert not report.ok
    assert verify_files(dest, sample=2).ok
