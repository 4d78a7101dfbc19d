"""Pure logic of the xNVMe validation: FIEMAP parsing, fallbacks, LBA plans, block map paths, reports."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from imgest.validate import blockdev
from imgest.validate.blockmap import BlockMap, FileMap, build_block_map
from imgest.validate.check import CheckConfig, EngineResult, verify_outputs
from imgest.validate.dataset import Sample, SplitView
from imgest.validate.engines import PythonFileEngine
from imgest.validate.fiemap import (
    EXTENT,
    HEADER,
    Extent,
    FiemapUnsupportedError,
    device_ranges,
    fallback_reason,
    file_extents,
    pack_request,
    parse_response,
)
from imgest.validate.report import report_dict, summary_text
from imgest.validate.runner import CheckReport


def _answered(extents: list[tuple[int, int, int, int]]) -> bytearray:
    """A FIEMAP buffer as the kernel fills it (logical, physical, length, flags per extent)."""
    buf = pack_request(0, 1 << 40, 4)
    HEADER.pack_into(buf, 0, 0, 1 << 40, 1, len(extents), 4, 0)
    for i, (logical, physical, length, flags) in enumerate(extents):
        EXTENT.pack_into(buf, HEADER.size + i * EXTENT.size, logical, physical, length, 0, 0, flags, 0, 0, 0)
    return buf


def test_fiemap_response_is_parsed_extent_by_extent() -> None:
    buf = _answered([(0, 4096 * 10, 8192, 0), (8192, 4096 * 50, 4096, 0x1)])
    assert HEADER.size == 32
    assert EXTENT.size == 56
    assert parse_response(buf) == [Extent(0, 40960, 8192, 0), Extent(8192, 204800, 4096, 1)]


@pytest.mark.parametrize(
    ("flags", "reason"),
    [(0x2, "unknown"), (0x4, "delalloc"), (0x8, "encoded"), (0x200, "inline"), (0x800, "unwritten"), (0x1, None)],
)
def test_flagged_extents_make_the_block_engine_fall_back(flags: int, reason: str | None) -> None:
    assert fallback_reason([Extent(0, 4096, 8192, flags)], 5000) == reason


def test_holes_and_short_maps_fall_back() -> None:
    assert fallback_reason([Extent(4096, 0, 4096, 1)], 8000) == "hole"
    assert fallback_reason([Extent(0, 0, 4096, 0)], 8000) == "hole"
    assert fallback_reason([], 10) == "empty"
    assert fallback_reason([Extent(0, 0, 4096, 0), Extent(4096, 1 << 20, 4096, 1)], 8000) is None


def test_device_ranges_follow_the_extents_across_a_boundary() -> None:
    extents = [Extent(0, 1_000_000, 4096, 0), Extent(4096, 5_000_000, 4096, 1)]
    assert list(device_ranges(extents, 4000, 200)) == [(1_004_000, 96), (5_000_000, 104)]
    assert list(device_ranges(extents, 0, 5000)) == [(1_000_000, 4096), (5_000_000, 904)]


def test_file_extents_of_a_real_file_cover_it(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(70_000))
    try:
        extents = file_extents(path)
    except FiemapUnsupportedError as exc:
        pytest.skip(str(exc))
    assert sum(e.length for e in extents) >= 70_000
    assert fallback_reason(extents, 70_000) is None  # FIEMAP_FLAG_SYNC: no delalloc left


def test_block_map_keys_are_relative_to_the_dataset_root(tmp_path: Path) -> None:
    (tmp_path / "train" / "n1").mkdir(parents=True)
    (tmp_path / "train" / "n1" / "a.jpg").write_bytes(b"x" * 5000)
    try:
        block_map = build_block_map(tmp_path, ["train/n1/a.jpg"])
    except (blockdev.NoBlockDeviceError, FiemapUnsupportedError) as exc:
        pytest.skip(str(exc))
    doc = block_map.to_dict()
    assert list(doc["files"]) == ["train/n1/a.jpg"]
    assert str(tmp_path) not in str(doc["files"])
    assert doc["files"]["train/n1/a.jpg"]["size"] == 5000


def test_a_tmpfs_path_has_no_block_device() -> None:
    if not Path("/dev/shm").is_dir() or os.major(os.stat("/dev/shm").st_dev) != 0:
        pytest.skip("/dev/shm is not a tmpfs here")
    with pytest.raises(blockdev.NoBlockDeviceError, match="no block device"):
        blockdev.device_of(Path("/dev/shm"))


def test_unreadable_device_error_names_it_and_the_permission(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # EACCES on a block device cannot be produced for root; a refused os.open stands in for it
    node = tmp_path / "loop9"
    node.write_bytes(b"")

    def refuse(path: object, flags: int) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(blockdev.os, "open", refuse)
    with pytest.raises(blockdev.DeviceAccessError) as info:
        blockdev.check_readable(node)
    assert str(node) in str(info.value)
    assert "read permission" in str(info.value)


def test_python_engine_reads_at_offsets(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(bytes(range(256)) * 4)
    samples = [Sample("a.bin", 10, 5, 0, ""), Sample("a.bin", 0, 1024, 0, "")]
    assert PythonFileEngine(tmp_path).read_batch(samples) == [bytes(range(10, 15)), bytes(range(256)) * 4]


def _split(data: dict[str, bytes]) -> SplitView:
    samples = tuple(Sample(p, 0, len(d), 0, hashlib.sha256(d).hexdigest()) for p, d in data.items())
    return SplitView(Path("/x"), "train", ("n1",), samples)


def test_a_changed_file_is_named_with_both_hashes() -> None:
    split = _split({"train/n1/a.jpg": b"good", "train/n1/b.jpg": b"fine"})
    result = EngineResult("xnvme_block")
    verify_outputs(
        result, [("train/n1/a.jpg", b"evil", 0), ("train/n1/b.jpg", b"fine", 1)], split, {"train/n1/b.jpg": 0}
    )
    assert result.mismatches == [
        {
            "engine": "xnvme_block",
            "path": "train/n1/a.jpg",
            "expected": hashlib.sha256(b"good").hexdigest(),
            "actual": hashlib.sha256(b"evil").hexdigest(),
        }
    ]
    assert result.label_mismatches == [
        {"engine": "xnvme_block", "path": "train/n1/b.jpg", "label": 1, "reader_label": 0}
    ]


def test_report_is_relative_to_the_python_file_api_and_lists_skips() -> None:
    results = [
        EngineResult("python_file", images=100, nbytes=10**7, seconds=1.0, info={"queue_depth": 1}),
        EngineResult("xnvme_block", images=100, nbytes=10**7, seconds=0.5, info={"queue_depth": 32, "backend": "b"}),
        EngineResult("xnvme_file", status="skipped", reason="libxnvme not found"),
        EngineResult(
            "dali_file", status="failed", images=100, nbytes=10**7, seconds=2.0,
            mismatches=[{"engine": "dali_file", "path": "p", "expected": "e" * 64, "actual": "a" * 64}],
        ),
    ]  # fmt: skip
    block_map = BlockMap(Path("/mnt/ds"), Path("/dev/loop3"), {"p": FileMap(1, (), "inline")})
    doc = report_dict(CheckReport(Path("/mnt/ds"), CheckConfig(), results, block_map))
    rows = {r["engine"]: r for r in doc["engines"]}
    assert rows["xnvme_block"]["relative_to_python_file"] == 2.0
    assert rows["dali_file"]["relative_to_python_file"] == 0.5
    assert doc["best_xnvme_relative_to_python_file"] == 2.0
    assert doc["skipped"] == {"xnvme_file": "libxnvme not found"}
    assert doc["ok"] is False
    assert doc["block_map"] == {"device": "/dev/loop3", "files": 1, "fallbacks": {"inline": 1}}
    text = summary_text(doc)
    assert f"MISMATCH dali_file p: expected {'e' * 64}, read {'a' * 64}" in text
