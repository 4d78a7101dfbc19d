"""Scanning every layout: labels, ids, junk, unlabelled files, tar of tars, manifest round-trip, memory."""

from __future__ import annotations

import io
import json
import tarfile
from collections import Counter
from pathlib import Path

import pytest

from imgest.core.errors import ConfigError
from imgest.sources.devdata.sample import SampleSpec, synsets, write_sample
from imgest.sources.manifest import image_id, iter_manifest, manifest_metadata, read_classes
from imgest.sources.read import read_candidate
from imgest.sources.scan import scan_to_dir
from imgest.sources.scanner import Scanner, detect_layout


@pytest.fixture(scope="module")
def cls_loc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("clsloc")
    write_sample(root, SampleSpec("cls-loc", classes=4, per_class=3, val_per_class=2, seed=1, defects=True))
    return root


@pytest.fixture(scope="module")
def imagefolder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imagenette")
    write_sample(root, SampleSpec("imagefolder", classes=3, per_class=3, val_per_class=2, seed=2))
    return root


def test_detects_layouts(cls_loc: Path, imagefolder: Path, tmp_path: Path) -> None:
    assert detect_layout(cls_loc) == "cls-loc"
    assert detect_layout(imagefolder) == "imagefolder"
    assert detect_layout(imagefolder / "train") == "flat"
    (tmp_path / "x.txt").write_text("x")
    with pytest.raises(ConfigError, match="not a tar"):
        detect_layout(tmp_path / "x.txt")
    with pytest.raises(ConfigError, match="does not exist"):
        detect_layout(tmp_path / "nope")


def test_cls_loc_labels_from_sorted_train_folders_and_val_csv(cls_loc: Path) -> None:
    scanner = Scanner(cls_loc, dataset="inet")
    rows = list(scanner.candidates())
    wnids = [w for w, _ in synsets(4)]
    assert [c.wnid for c in scanner.report.classes] == sorted(wnids)
    assert scanner.report.classes[0].name.startswith("tench")
    by_split = Counter(c.split for c in rows)
    assert by_split["val"] == 4 * 2
    for cand in rows:
        assert cand.label == sorted(wnids).index(cand.wnid)
    val = [c for c in rows if c.split == "val"]
    # the sample writes val images class by class: image n belongs to class (n - 1) // 2
    for cand in val:
        number = int(Path(cand.rel_path).stem.rsplit("_", 1)[1])
        assert cand.wnid == wnids[(number - 1) // 2]


def test_cls_loc_reports_junk_unlabelled_and_missing(cls_loc: Path) -> None:
    scanner = Scanner(cls_loc)
    list(scanner.candidates())
    report = scanner.report
    assert report.junk == {"system-file": 2, "non-image-extension": 1, "hidden-folder": 1}
    assert [(e.path, e.reason) for e in report.quarantine.entries] == [("val/ILSVRC2012_val_99999999.JPEG", "no-label")]
    assert report.missing_files == ["ILSVRC2012_val_99999998"]
    assert report.candidates == report.accepted + 1


def test_same_mapping_for_every_split(imagefolder: Path) -> None:
    rows = list(Scanner(imagefolder).candidates())
    mapping = {(c.split, c.wnid): c.label for c in rows}
    for wnid in {c.wnid for c in rows}:
        assert mapping[("train", wnid)] == mapping[("val", wnid)]
    assert sorted({c.split for c in rows}) == ["train", "val"]


def test_split_missing_a_class_warns(tmp_path: Path) -> None:
    write_sample(tmp_path, SampleSpec("imagefolder", classes=3, per_class=1, val_per_class=1, seed=3))
    victim = sorted((tmp_path / "val").iterdir())[0]
    for f in victim.iterdir():
        f.unlink()
    victim.rmdir()
    scanner = Scanner(tmp_path)
    assert len(scanner.report.classes) == 3
    assert any("lacks 1 classes" in w for w in scanner.report.warnings)


def test_flat_layout_and_files_outside_class_folders(imagefolder: Path, tmp_path: Path) -> None:
    flat = tmp_path / "flat"
    for cand in Scanner(imagefolder).candidates():
        if cand.split == "train":
            dest = flat / cand.wnid / Path(cand.rel_path).name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes((imagefolder / cand.rel_path).read_bytes())
    (flat / "loose.JPEG").write_bytes(b"\xff\xd8\xff")
    scanner = Scanner(flat, layout="auto", flat_split="all")
    rows = list(scanner.candidates())
    assert scanner.layout == "flat"
    assert {c.split for c in rows} == {"all"}
    assert len(rows) == 9
    assert [(e.path, e.reason) for e in scanner.report.quarantine.entries] == [("loose.JPEG", "no-label")]


def test_ids_are_deterministic_uuids(cls_loc: Path) -> None:
    first = [c.id for c in Scanner(cls_loc, dataset="inet").candidates()]
    again = [c.id for c in Scanner(cls_loc, dataset="inet").candidates()]
    other = [c.id for c in Scanner(cls_loc, dataset="other").candidates()]
    assert first == again
    assert len(set(first)) == len(first)
    assert not set(first) & set(other)
    assert first[0] == image_id("inet", "train", Scanner(cls_loc).candidates().__next__().rel_path)


def _tar_of_tars(src: Path, dest: Path) -> Path:
    """An ILSVRC2012_img_train.tar-style archive: one tar per class, holding that class's images."""
    outer_path = dest / "ILSVRC2012_img_train.tar"
    with tarfile.open(outer_path, "w") as outer:
        for class_dir in sorted((src / "train").iterdir()):
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as inner:
                for f in sorted(class_dir.iterdir()):
                    inner.add(f, arcname=f.name)
            info = tarfile.TarInfo(f"{class_dir.name}.tar")
            info.size = buf.tell()
            buf.seek(0)
            outer.addfile(info, buf)
    return outer_path


def test_tar_of_tars_read_in_place(imagefolder: Path, tmp_path: Path) -> None:
    tar_path = _tar_of_tars(imagefolder, tmp_path)
    out = tmp_path / "manifest"
    report = scan_to_dir(tar_path, out)
    assert report.layout == "tar"
    rows = list(iter_manifest(out / "manifest.parquet"))
    folder_rows = [c for c in Scanner(imagefolder).candidates() if c.split == "train"]
    assert len(rows) == len(folder_rows) == 9
    assert [c.wnid for c in read_classes(out / "classes.json")] == sorted({c.wnid for c in folder_rows})
    root = Path(manifest_metadata(out / "manifest.parquet")["root"])
    for cand in rows:
        original = imagefolder / "train" / cand.wnid / Path(cand.rel_path).name
        assert read_candidate(root, cand) == original.read_bytes()
        assert cand.container == tar_path.name
        assert cand.label == sorted({c.wnid for c in folder_rows}).index(cand.wnid)
    assert list(tmp_path.glob("*.JPEG")) == []  # nothing unpacked


def test_scan_to_dir_writes_all_reports(cls_loc: Path, tmp_path: Path) -> None:
    report = scan_to_dir(cls_loc, tmp_path, dataset="inet")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["classes.json", "manifest.parquet", "quarantine.json", "scan_report.json"]
    quarantine = json.loads((tmp_path / "quarantine.json").read_text())
    assert quarantine["candidates"] == quarantine["kept"] + quarantine["quarantined"]
    assert quarantine["by_reason"] == {"no-label": 1}
    summary = json.loads((tmp_path / "scan_report.json").read_text())
    assert summary["kept"] == report.accepted == sum(1 for _ in iter_manifest(tmp_path / "manifest.parquet"))
    assert manifest_metadata(tmp_path / "manifest.parquet")["dataset"] == "inet"


MEMORY_PROBE = """
import resource, sys
from pathlib import Path
from imgest.sources.manifest import Candidate, image_id, iter_manifest, write_manifest

def rows(n):
    for i in range(n):
        rel = f"train/n{i % 1000:08d}/n{i % 1000:08d}_{i}.JPEG"
        yield Candidate(image_id("inet", "train", rel), "train", rel, f"n{i % 1000:08d}", i % 1000, 110_000, 0.0)

def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024

path, n = Path(sys.argv[1]), int(sys.argv[2])
base = rss_mib()
written = write_manifest(rows(n), path)
after_write = rss_mib()
read = sum(1 for _ in iter_manifest(path))
print(written, read, after_write - base, rss_mib() - base)
"""


@pytest.mark.slow  # 1.28 M rows: the full tier's, not the quick one's
def test_manifest_streams_1_3_million_rows_in_flat_memory(tmp_path: Path) -> None:
    """An ImageNet-sized manifest (1,281,167 rows) costs about what a tenth of it does: memory is flat."""
    import subprocess
    import sys

    def probe(n: int) -> list[int]:
        cmd = [sys.executable, "-c", MEMORY_PROBE, str(tmp_path / f"m{n}.parquet"), str(n)]
        return list(map(int, subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()))

    small, full = probe(128_116), probe(1_281_167)
    assert full[:2] == [1_281_167, 1_281_167]
    assert small[:2] == [128_116, 128_116]
    # 10x the rows: growth stays within a constant of the small run (a list of 1.28M rows would add >500 MiB)
    assert full[2] < small[2] + 48
    assert full[3] < small[3] + 48


def test_read_whole_reads_a_file_whatever_its_size_became_since_the_scan(tmp_path: Path) -> None:
    from imgest.sources.read import read_whole

    path = tmp_path / "f.bin"
    body = bytes(range(256)) * 5000  # 1.28 MB: more than one read of the grown case
    path.write_bytes(body)
    assert read_whole(str(path), len(body)) == body  # as scanned
    assert read_whole(str(path), 10) == body  # grew since the scan: read to its end
    assert read_whole(str(path), len(body) + 99) == body  # shrank: what is there
    assert read_whole(str(path), 0) == body
