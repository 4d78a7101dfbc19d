"""ImageNet's two archives read in place: the train tar of class tars and the flat val tar with its CSV labels."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from imgest.core.errors import ConfigError
from imgest.sources.devdata.sample import EXPECTED_DEFECTS_FILE, SampleSpec, write_sample
from imgest.sources.manifest import image_id, iter_manifest, manifest_metadata, read_classes
from imgest.sources.read import read_candidate
from imgest.sources.scan import scan_to_dir
from imgest.sources.scanner import Scanner, detect_layout
from imgest.sources.valsolution import ValSolutionError, read_val_solution

SPEC = SampleSpec("tar", classes=4, per_class=3, val_per_class=2, seed=1)
TRAIN, VAL, CSV = "ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar", "LOC_val_solution.csv"


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imagenet")
    write_sample(root, SPEC)
    return root


@pytest.fixture(scope="module")
def with_defects(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imagenet-defects")
    write_sample(root, SampleSpec("tar", classes=3, per_class=2, val_per_class=2, seed=2, defects=True))
    return root


def copy_archives(src: Path, dest: Path, *names: str) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copyfile(src / name, dest / name)
    return dest


def members(tar: Path | bytes) -> dict[str, bytes]:
    """Every regular member's bytes, read with tarfile itself (the oracle for the scanner's offsets)."""
    source = io.BytesIO(tar.read_bytes() if isinstance(tar, Path) else tar)
    with tarfile.open(fileobj=source) as opened:
        return {m.name: opened.extractfile(m).read() for m in opened.getmembers() if m.isfile()}  # type: ignore[union-attr]


def csv_wnids(path: Path) -> dict[str, str]:
    with open(path, newline="") as fh:
        return {row["ImageId"]: row["PredictionString"].split()[0] for row in csv.DictReader(fh)}


def test_both_archives_scanned_in_place_with_csv_labels(archives: Path, tmp_path: Path) -> None:
    before = sorted(p.name for p in archives.iterdir())
    assert detect_layout(archives) == "tar"
    report = scan_to_dir(archives, tmp_path / "m", dataset="inet")
    rows = list(iter_manifest(tmp_path / "m" / "manifest.parquet"))
    assert dict(report.per_split) == {"train": 4 * 3, "val": 4 * 2}
    train_wnids = sorted({c.wnid for c in rows if c.split == "train"})
    assert [c.wnid for c in read_classes(tmp_path / "m" / "classes.json")] == train_wnids
    labels = csv_wnids(archives / CSV)
    val = [c for c in rows if c.split == "val"]
    assert sorted(c.rel_path for c in val) == sorted(f"{i}.JPEG" for i in labels)
    for cand in val:
        assert cand.wnid == labels[Path(cand.rel_path).stem]  # the first wnid of the image's CSV row
        assert cand.label == train_wnids.index(cand.wnid)  # its position among the sorted train classes
        assert cand.container == VAL
    assert {c.container for c in rows if c.split == "train"} == {TRAIN}
    assert len(report.quarantine) == 0
    assert report.missing_files == []
    assert sorted(p.name for p in archives.iterdir()) == before  # nothing unpacked


def test_bytes_read_back_by_offset_equal_the_archived_images(archives: Path, tmp_path: Path) -> None:
    scan_to_dir(archives, tmp_path)
    root = Path(manifest_metadata(tmp_path / "manifest.parquet")["root"])
    assert root == archives.resolve()
    val_members = members(archives / VAL)
    train_members = {}
    for name, data in members(archives / TRAIN).items():
        train_members.update({f"{name}/{k}": v for k, v in members(data).items()})
    read = 0
    for cand in iter_manifest(tmp_path / "manifest.parquet"):
        original = val_members[cand.rel_path] if cand.split == "val" else train_members[cand.rel_path]
        assert read_candidate(root, cand) == original
        read += 1
    assert read == len(val_members) + len(train_members) == 20


def test_archives_hold_the_cls_loc_sample_and_label_it_the_same(archives: Path, tmp_path: Path) -> None:
    """Same seed: the archives hold the CLS-LOC tree's images, and both layouts give every image the same label."""
    tree = tmp_path / "tree"
    write_sample(tree, SampleSpec("cls-loc", SPEC.classes, SPEC.per_class, SPEC.val_per_class, SPEC.seed))
    folder = {(c.split, Path(c.rel_path).name): c for c in Scanner(tree).candidates()}
    scanner = Scanner(archives)
    root = scanner._root
    tars = {(c.split, Path(c.rel_path).name): c for c in scanner.candidates()}
    assert folder.keys() == tars.keys()
    for key, cand in tars.items():
        assert (cand.wnid, cand.label) == (folder[key].wnid, folder[key].label)
        assert read_candidate(root, cand) == read_candidate(tree / "ILSVRC" / "Data" / "CLS-LOC", folder[key])


def test_ids_are_deterministic_and_the_same_from_the_folder_or_the_train_tar(archives: Path) -> None:
    from_folder = [(c.id, c.split, c.rel_path) for c in Scanner(archives, dataset="inet").candidates()]
    again = [(c.id, c.split, c.rel_path) for c in Scanner(archives, dataset="inet").candidates()]
    from_tar = Scanner(archives / TRAIN, dataset="inet")
    assert from_tar.layout == "tar"
    assert from_tar.splits() == ["train", "val"]
    assert from_folder == again == [(c.id, c.split, c.rel_path) for c in from_tar.candidates()]
    assert len({i for i, _, _ in from_folder}) == len(from_folder) == 20
    for id_, split, rel in from_folder:
        assert id_ == image_id("inet", split, rel)
    assert Scanner(archives / TRAIN).dataset == "ILSVRC2012_img_train"  # a train-tar source keeps its old ids


def test_train_tar_alone_scans_train_only(archives: Path, tmp_path: Path) -> None:
    alone = copy_archives(archives, tmp_path / "alone", TRAIN, CSV)
    scanner = Scanner(alone / TRAIN)
    rows = list(scanner.candidates())
    assert {c.split for c in rows} == {"train"}
    assert len(rows) == 12
    assert scanner.splits() == ["train"]


def test_val_label_defects_are_quarantined_with_their_reason(with_defects: Path, tmp_path: Path) -> None:
    report = scan_to_dir(with_defects, tmp_path, dataset="inet")
    entries = sorted(report.quarantine.entries, key=lambda e: e.path)
    assert [(e.path, e.split, e.reason) for e in entries] == [
        ("ILSVRC2012_val_99999997.JPEG", "val", "no-label"),
        ("ILSVRC2012_val_99999999.JPEG", "val", "no-label"),
    ]
    assert "n99999999" in entries[0].detail
    assert "not a train class" in entries[0].detail
    assert entries[1].detail == f"no row in {CSV}"
    assert [e.id for e in entries] == [image_id("inet", "val", e.path) for e in entries]
    expected = json.loads((with_defects / EXPECTED_DEFECTS_FILE).read_text())
    assert {e.path: e.reason for e in entries} == expected
    # a label row naming no image is listed in the report, with a warning
    assert report.missing_files == ["ILSVRC2012_val_99999998"]
    saved = json.loads((tmp_path / "scan_report.json").read_text())
    assert saved["label_rows_without_file"] == 1
    assert saved["label_rows_without_file_sample"] == ["ILSVRC2012_val_99999998"]
    assert any("1 rows of LOC_val_solution.csv name no image" in w for w in saved["warnings"])
    quarantine = json.loads((tmp_path / "quarantine.json").read_text())
    assert quarantine["candidates"] == quarantine["kept"] + 2 == 3 * 2 + 3 * 2 + 2
    assert all(c.split == "train" or c.wnid != "n99999999" for c in iter_manifest(tmp_path / "manifest.parquet"))


def test_val_tar_without_its_csv_quarantines_every_val_image(archives: Path, tmp_path: Path) -> None:
    folder = copy_archives(archives, tmp_path / "nocsv", TRAIN, VAL)
    (folder / "ILSVRC2012_validation_ground_truth.txt").write_text("65\n970\n")
    scanner = Scanner(folder)
    rows = list(scanner.candidates())
    assert {c.split for c in rows} == {"train"}
    assert [e.reason for e in scanner.report.quarantine.entries] == ["no-label"] * 8
    warning = next(w for w in scanner.report.warnings if "no LOC_val_solution.csv" in w)
    assert str(folder) in warning
    assert "ILSVRC2012_validation_ground_truth.txt is not read" in warning


MALFORMED = [
    ("ImageId;PredictionString\nILSVRC2012_val_00000001;n01440764 1 1 2 2\n", 1, "header"),
    ("ImageId,PredictionString\nILSVRC2012_val_00000001,n01440764 1 1 2 2\nILSVRC2012_val_00000002,\n", 3, "empty"),
    ("ImageId,PredictionString\nILSVRC2012_val_00000001,n01440764 1 1 2 2,extra\n", 2, "3 fields"),
    ("ImageId,PredictionString\nILSVRC2012_val_00000001,n01440764\n\nILSVRC2012_val_00000001,n01443537\n", 4, "second"),
    ("", 1, "header"),
]


@pytest.mark.parametrize(("text", "line", "problem"), MALFORMED)
def test_malformed_csv_fails_naming_file_and_line(
    archives: Path, tmp_path: Path, text: str, line: int, problem: str
) -> None:
    folder = copy_archives(archives, tmp_path / "bad", TRAIN, VAL)
    (folder / CSV).write_text(text)
    scanner = Scanner(folder)
    candidates = scanner.candidates()
    with pytest.raises(ValSolutionError, match=rf"{re.escape(str(folder / CSV))} line {line}: .*{problem}") as err:
        next(candidates)  # the labels are read before any image is listed
    assert isinstance(err.value, ConfigError)


def test_kaggle_rows_label_by_their_first_wnid(tmp_path: Path) -> None:
    path = tmp_path / CSV
    path.write_text(
        "\ufeffImageId,PredictionString\n"
        "ILSVRC2012_val_00008726,n02119789 255 142 454 329 n02119789 44 21 322 295 \n"
        "ILSVRC2012_val_00000001,n01751748 1 2 3 4 n09999999 5 6 7 8\n"
    )
    assert read_val_solution(path) == {"ILSVRC2012_val_00008726": "n02119789", "ILSVRC2012_val_00000001": "n01751748"}


def test_source_rules(archives: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"ImageNet's val tar.*give the folder"):
        Scanner(archives / VAL)
    only_val = copy_archives(archives, tmp_path / "only-val", VAL, CSV)
    assert detect_layout(only_val) == "cls-loc"  # no train tar: not the tar layout
    with pytest.raises(ConfigError, match=f"holds no {TRAIN}"):
        Scanner(only_val, layout="tar")
    with pytest.raises(ConfigError, match=r"split 'val'.*choose another --split"):
        Scanner(archives, flat_split="val")
    unpacked = copy_archives(archives, tmp_path / "unpacked", TRAIN)
    (unpacked / "train" / "n01440764").mkdir(parents=True)
    assert detect_layout(unpacked) == "imagefolder"  # an unpacked tree beside the tar wins


def test_damaged_val_tar_keeps_what_was_read_and_quarantines_the_cut_member(archives: Path, tmp_path: Path) -> None:
    folder = copy_archives(archives, tmp_path / "cut", TRAIN, VAL, CSV)
    with tarfile.open(folder / VAL) as tar:
        second = tar.getmembers()[1]
    data = (folder / VAL).read_bytes()
    (folder / VAL).write_bytes(data[: second.offset_data + 100])  # cut inside the second image
    report = scan_to_dir(folder, tmp_path / "m")
    val = [c for c in iter_manifest(tmp_path / "m" / "manifest.parquet") if c.split == "val"]
    assert [c.rel_path for c in val] == ["ILSVRC2012_val_00000001.JPEG"]
    assert report.per_split["train"] == 12
    assert [(e.path, e.reason) for e in report.quarantine.entries] == [("ILSVRC2012_val_00000002.JPEG", "corrupt")]
    assert [(b["container"], b["members_read"]) for b in report.broken_containers] == [(VAL, 2)]
    assert any(w.startswith(f"val tar {VAL} is unreadable after 2 members") for w in report.warnings)
    assert sorted(report.missing_files) == [f"ILSVRC2012_val_{i:08d}" for i in range(2, 9)]


FLAT_TAR_PROBE = """
import resource, sys
from pathlib import Path
from imgest.sources.tarsource import FlatTar
from imgest.sources.tree import Skips

base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
n = sum(1 for _ in FlatTar(Path(sys.argv[1]), Skips()).entries())
print(n, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024 - base)
"""

WRITE_TAR = """
import io, sys, tarfile
with tarfile.open(sys.argv[1], "w") as tar:
    for i in range(int(sys.argv[2])):
        info = tarfile.TarInfo(f"ILSVRC2012_val_{i + 1:08d}.JPEG")
        tar.addfile(info, io.BytesIO(b""))
        tar.members.clear()
"""


@pytest.mark.slow  # 10x the members: the full tier's
def test_val_tar_headers_stream_in_flat_memory(tmp_path: Path) -> None:
    """Listing 10x the members costs about the same memory: no TarInfo is kept per member."""

    def probe(n: int) -> list[int]:
        path = tmp_path / f"val{n}.tar"
        subprocess.run([sys.executable, "-c", WRITE_TAR, str(path), str(n)], check=True)
        done = subprocess.run([sys.executable, "-c", FLAT_TAR_PROBE, str(path)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return list(map(int, done.stdout.split()))

    small, full = probe(10_000), probe(100_000)
    assert small[0] == 10_000
    assert full[0] == 100_000
    assert full[1] < small[1] + 16  # tarfile keeping its 100,000 TarInfo objects adds about 45 MiB
