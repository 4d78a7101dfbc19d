"""Hostile sources: broken class tars, odd tar members, link loops, links out of the tree, empty classes.

Every input here is crafted by the test; the scan must finish, keep what is readable and report the rest.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from PIL import Image

from imgest.core.errors import NothingIngestibleError
from imgest.core.quarantine import QuarantineLog
from imgest.sources.manifest import iter_manifest, read_classes
from imgest.sources.scan import scan_to_dir
from imgest.sources.scanner import Scanner
from imgest.transform.image import TransformSpec
from imgest.transform.pipeline import OUTSIDE_DETAIL, process_candidates


def jpeg(seed: int = 0) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (40, 30), (seed * 40 % 256, 90, 160)).save(out, "JPEG")
    return out.getvalue()


def class_tar(n: int, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(n):
            data = jpeg(seed + i)
            info = tarfile.TarInfo(f"img_{i}.JPEG")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def add_special(tar: tarfile.TarFile, name: str, kind: bytes, linkname: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    tar.addfile(info)


@pytest.fixture
def hostile_tar(tmp_path: Path) -> Path:
    """Good class tars a and e; b is garbage, c is cut inside its second image, d is 0 bytes, f is cut inside
    its second header."""
    path = tmp_path / "train.tar"
    truncated = class_tar(3)[:2300]
    with tarfile.open(path, "w") as outer:
        add_bytes(outer, "n0000000a.tar", class_tar(2))
        add_bytes(outer, "n0000000b.tar", b"this is not a tar archive at all " * 40)
        add_bytes(outer, "n0000000c.tar", truncated)
        add_bytes(outer, "n0000000d.tar", b"")
        add_bytes(outer, "n0000000e.tar", class_tar(3, seed=5))
        add_bytes(outer, "n0000000f.tar", class_tar(3)[:2000])
    return path


def test_broken_class_tars_are_reported_and_every_readable_member_kept(hostile_tar: Path, tmp_path: Path) -> None:
    report = scan_to_dir(hostile_tar, tmp_path / "m")
    rows = list(iter_manifest(tmp_path / "m" / "manifest.parquet"))
    kept = sorted(r.rel_path for r in rows)
    assert [w.wnid for w in read_classes(tmp_path / "m" / "classes.json")] == [f"n0000000{c}" for c in "abcdef"]
    assert "n0000000c.tar/img_0.JPEG" in kept  # read before the damage
    assert len([k for k in kept if k.startswith("n0000000a")]) == 2
    assert len([k for k in kept if k.startswith("n0000000e")]) == 3
    broken = {b["container"]: b for b in report.broken_containers}
    assert set(broken) == {"n0000000b.tar", "n0000000c.tar", "n0000000d.tar", "n0000000f.tar"}
    assert broken["n0000000f.tar"]["members_read"] == 1
    assert "end-of-archive" in broken["n0000000f.tar"]["error"]
    assert broken["n0000000d.tar"]["members_read"] == 0
    assert "empty" in broken["n0000000d.tar"]["error"]
    assert broken["n0000000c.tar"]["member_count"] == "unknown"
    quarantine = QuarantineLog.read(tmp_path / "m" / "quarantine.json")
    assert [(e.path, e.reason) for e in quarantine.entries] == [("n0000000c.tar/img_1.JPEG", "corrupt")]
    saved = json.loads((tmp_path / "m" / "scan_report.json").read_text())
    assert len(saved["unreadable_containers"]) == 4
    assert any("n0000000d.tar is unreadable" in w for w in saved["warnings"])
    labels = {r.wnid: r.label for r in rows}
    # damaged classes keep their place
    assert labels == {"n0000000a": 0, "n0000000c": 2, "n0000000e": 4, "n0000000f": 5}


def test_tar_links_devices_and_unsafe_class_names_are_reported(tmp_path: Path) -> None:
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w") as tar:
        add_bytes(tar, "ok.JPEG", jpeg())
        add_special(tar, "sym.JPEG", tarfile.SYMTYPE, "/etc/passwd")
        add_special(tar, "hard.JPEG", tarfile.LNKTYPE, "ok.JPEG")
        add_special(tar, "dev.JPEG", tarfile.CHRTYPE)
    path = tmp_path / "train.tar"
    with tarfile.open(path, "w") as outer:
        add_bytes(outer, "n00000001.tar", inner.getvalue())
        add_bytes(outer, "../n09999997.tar", class_tar(1))
        add_bytes(outer, "sub/n09999998.tar", class_tar(1))
        add_special(outer, "n09999999.tar", tarfile.SYMTYPE, "n00000001.tar")
    report = scan_to_dir(path, tmp_path / "m")
    assert [c.wnid for c in report.classes] == ["n00000001"]
    assert report.accepted == 1
    counts = report.skipped.counts
    assert counts == {"tar-symlink": 2, "tar-hardlink": 1, "tar-device-or-fifo": 1, "tar-unsafe-name": 2}
    assert any("../n09999997.tar" in s for s in report.skipped.samples["tar-unsafe-name"])


def write_images(folder: Path, n: int, seed: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"img_{i}.JPEG").write_bytes(jpeg(seed + i))


def test_symlink_loops_are_skipped_and_counted(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_images(src / "n01", 2)
    write_images(src / "n02", 1)
    (src / "n01" / "back").symlink_to("..")  # a loop through the root
    (src / "n02" / "self").symlink_to("self")  # ELOOP on stat
    (src / "loop").symlink_to(".")
    report = scan_to_dir(src, tmp_path / "m")
    assert report.accepted == 3
    assert report.skipped.counts["link-loop"] == 3
    assert {c.wnid for c in report.classes} == {"loop", "n01", "n02"}
    assert any("class 'loop' has no image; its label 0 is kept" in w for w in report.warnings)


@pytest.fixture
def linked_out(tmp_path: Path) -> Path:
    """A flat source whose class n02 links to a folder outside it, and a file link to a private file."""
    src = tmp_path / "src"
    write_images(src / "n01", 2)
    write_images(tmp_path / "elsewhere", 3)
    (src / "n02").symlink_to(tmp_path / "elsewhere")
    secret = tmp_path / "private.txt"
    secret.write_text("PRIVATE-KEY-MATERIAL do not publish")
    (src / "n01" / "leak.JPEG").symlink_to(secret)
    (src / "n01" / "inside.JPEG").symlink_to(src / "n01" / "img_0.JPEG")
    return src


def test_links_leaving_the_tree_are_not_followed_by_default(linked_out: Path, tmp_path: Path) -> None:
    report = scan_to_dir(linked_out, tmp_path / "m")
    rows = list(iter_manifest(tmp_path / "m" / "manifest.parquet"))
    assert sorted(r.rel_path for r in rows) == ["n01/img_0.JPEG", "n01/img_1.JPEG", "n01/inside.JPEG"]
    assert report.skipped.counts == {"link-outside-tree": 2}
    saved = json.loads((tmp_path / "m" / "scan_report.json").read_text())
    assert saved["skipped"]["counts"] == {"link-outside-tree": 2}
    assert saved["empty_classes"] == [{"wnid": "n02", "label": 1}]
    assert "PRIVATE" not in (tmp_path / "m" / "quarantine.json").read_text()


def test_following_external_links_on_request_never_records_their_content(linked_out: Path, tmp_path: Path) -> None:
    report = scan_to_dir(linked_out, tmp_path / "m", follow_external_links=True)
    assert report.skipped.counts == {}
    assert report.per_class == {"n01": 4, "n02": 3}
    rows = list(iter_manifest(tmp_path / "m" / "manifest.parquet"))
    quarantine = QuarantineLog()
    stored = list(process_candidates(rows, linked_out, TransformSpec("jpeg", 32, 32, 90), quarantine))
    assert len(stored) == 6
    [entry] = quarantine.entries
    assert entry.path == "n01/leak.JPEG"
    assert entry.reason == "not-an-image"
    assert entry.detail == OUTSIDE_DETAIL
    assert "PRIVATE" not in entry.detail


def test_inside_candidates_keep_their_first_bytes_in_the_record(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_images(src / "n01", 1)
    (src / "n01" / "text.JPEG").write_text("hello, not an image")
    rows = list(Scanner(src).candidates())
    quarantine = QuarantineLog()
    list(process_candidates(rows, src, TransformSpec("jpeg", 32, 32, 90), quarantine))
    assert "starts b'hello, n'" in quarantine.entries[0].detail


def test_empty_class_folder_keeps_its_label_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    src = tmp_path / "src"
    write_images(src / "a", 1)
    (src / "b").mkdir()
    write_images(src / "c", 1)
    report = scan_to_dir(src, tmp_path / "m")
    rows = list(iter_manifest(tmp_path / "m" / "manifest.parquet"))
    assert {r.wnid: r.label for r in rows} == {"a": 0, "c": 2}
    assert "class 'b' has no image; its label 1 is kept" in caplog.text
    assert [c["wnid"] for c in report.to_dict()["empty_classes"]] == ["b"]


def test_nothing_kept_fails_naming_the_quarantine_list(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "n01").mkdir(parents=True)
    (src / "n01" / "notes.txt").write_text("no images here")
    (src / "stray.JPEG").write_bytes(jpeg())  # not in a class folder: no label
    out = tmp_path / "m"
    with pytest.raises(NothingIngestibleError, match=r"nothing is ingestible .* 0 of 1 candidates kept") as exc:
        scan_to_dir(src, out)
    assert str(out / "quarantine.json") in str(exc.value)
    assert (out / "quarantine.json").is_file()
    assert (out / "scan_report.json").is_file()


def test_fifo_in_a_folder_source_is_skipped_not_read(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_images(src / "n01", 1)
    os.mkfifo(src / "n01" / "pipe.JPEG")
    report = scan_to_dir(src, tmp_path / "m")
    assert report.accepted == 1
    assert report.skipped.counts == {"not-a-regular-file": 1}
