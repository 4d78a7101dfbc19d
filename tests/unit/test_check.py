"""A sample with every kind of bad and awkward file: each ends stored or quarantined with the right reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imgest.cli import main
from imgest.sources.devdata.sample import EXPECTED_DEFECTS_FILE, SampleSpec, write_sample
from imgest.sources.scan import scan_to_dir
from imgest.transform.check import check_dataset
from imgest.transform.image import TransformSpec


@pytest.fixture(scope="module")
def scanned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("manifest")
    write_sample(src, SampleSpec("cls-loc", classes=3, per_class=4, val_per_class=2, seed=4, defects=True))
    scan_to_dir(src, out)
    return src, out


def test_every_candidate_is_stored_or_quarantined_with_expected_reason(scanned: tuple[Path, Path]) -> None:
    src, out = scanned
    report = check_dataset(out, TransformSpec(), workers=2)
    expected = json.loads((src / EXPECTED_DEFECTS_FILE).read_text())
    got = {e["path"]: e["reason"] for e in report["entries"]}
    quarantined_expected = {p: fate for p, fate in expected.items() if fate not in ("kept", "junk")}
    assert got == quarantined_expected
    assert report["candidates"] == report["passed"] + report["quarantined"]
    scan = json.loads((out / "scan_report.json").read_text())
    assert report["candidates"] == scan["candidates"]
    kept = {p for p, fate in expected.items() if fate == "kept"}
    assert report["passed"] == scan["kept"] - (len(quarantined_expected) - 1)  # no-label never reached check
    from imgest.sources.manifest import iter_manifest

    checked = {c.rel_path for c in iter_manifest(out / "manifest.parquet")}
    assert kept <= checked - set(got)  # every awkward-but-valid image was checked and passed
    assert json.loads((out / "check.json").read_text())["summary"] == report["summary"]


def test_unchanged_mode_quarantines_the_same_files(scanned: tuple[Path, Path]) -> None:
    _, out = scanned
    jpeg = check_dataset(out, TransformSpec(), workers=1)
    unchanged = check_dataset(out, TransformSpec(mode="unchanged"), workers=1)
    assert unchanged["by_reason"] == jpeg["by_reason"]
    # unchanged output is the input itself, minus the files that were quarantined
    assert unchanged["bytes_out"] == unchanged["bytes_in"] - _quarantined_bytes(out, unchanged)


def _quarantined_bytes(out: Path, report: dict) -> int:
    from imgest.sources.manifest import iter_manifest

    bad = {e["id"] for e in report["entries"]}
    return sum(c.size for c in iter_manifest(out / "manifest.parquet") if c.id in bad)


def test_cli_sample_scan_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "src", tmp_path / "m"
    assert (
        main(
            [
                "sample",
                str(src),
                "--layout",
                "imagefolder",
                "--classes",
                "2",
                "--per-class",
                "2",
                "--val-per-class",
                "1",
                "--defects",
            ]
        )
        == 0
    )
    assert main(["scan", str(src), "--out", str(out)]) == 0
    assert main(["check", str(out), "--workers", "1"]) == 0
    lines = capsys.readouterr().out
    assert "imagefolder dataset 'src'" in lines
    assert "quarantined 5 of" in lines
    assert "corrupt=2 empty=1 not-an-image=1 too-large=1" in lines
