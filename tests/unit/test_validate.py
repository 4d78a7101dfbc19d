"""Pure logic of the xNVMe validation: FIEMAP parsing, fallbacks, LBA plans, block map paths, reports."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from imgest.cli import build_parser
from imgest.core import defaults
from imgest.core.sampling import SampleReport
from imgest.validate import blockdev
from imgest.validate.blockmap import BlockMap, build_block_map
from imgest.validate.check import BAD_BYTES, BAD_LABEL, LISTED, READ, CheckConfig, EngineResult, verify_batch
from imgest.validate.dataset import Sample, SplitView, load_split, planned_images
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
from tests.validate_fixtures import write_random_files


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
    block_map.save(tmp_path / "map.npz")
    with np.load(tmp_path / "map.npz") as z:
        assert z["paths"].tolist() == [b"train/n1/a.jpg"]
        assert z["sizes"].tolist() == [5000]
        assert str(tmp_path).encode() not in z["paths"].tobytes()
        assert z["extents"][:, 2].sum() >= 5000  # the length column covers the file


def test_block_map_columns_round_trip_and_find_files() -> None:
    entries = [
        ("train/n2/b.jpg", 9000, [Extent(0, 1 << 20, 4096, 0), Extent(4096, 8 << 20, 8192, 1)], None),
        ("train/n1/a.jpg", 10, [], "empty"),
        ("val/n1/c.jpg", 70, [Extent(0, 0, 4096, 0x201)], "inline"),
    ]
    block_map = BlockMap.of(Path("/mnt/ds"), Path("/dev/loop3"), iter(entries))
    assert len(block_map) == 3
    assert block_map.find("train/n2/b.jpg") == 0
    assert block_map.find("val/n1/c.jpg") == 2
    assert block_map.find("val/n1/missing.jpg") == -1
    assert block_map.entry(0) == (9000, entries[0][2], None)
    assert block_map.entry(2) == (70, entries[2][2], "inline")
    assert block_map.fallback_counts() == {"empty": 1, "inline": 1}
    assert block_map.extents.shape == (3, 4)  # one array for every file's extents, not a structure per file


def test_block_map_is_written_as_columns_and_read_back(tmp_path: Path) -> None:
    entries = ((f"train/n1/{i:07d}.jpg", i, [Extent(0, i * 4096, 4096, 1)], None) for i in range(20_000))
    block_map = BlockMap.of(Path("/mnt/ds"), Path("/dev/loop3"), entries)  # more than one build chunk
    block_map.save(tmp_path / "block_map.npz")
    back = BlockMap.load(tmp_path / "block_map.npz", Path("/other/mount"))
    assert back.device == Path("/dev/loop3")
    assert len(back) == 20_000
    assert back.entry(12_345) == (12_345, [Extent(0, 12_345 * 4096, 4096, 1)], None)
    assert back.find("train/n1/0019999.jpg") == 19_999
    assert (tmp_path / "block_map.npz").stat().st_size < 20_000 * 40  # compact: far under the indented JSON


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
    paths = np.array([p.encode() for p in sorted(data)], dtype="S")
    digests = b"".join(hashlib.sha256(data[p]).digest() for p in sorted(data))
    report = SampleReport(0, 0, len(data), len(data), "rows", {})
    return SplitView(
        Path("/x"),
        "train",
        ("n1",),
        paths,
        np.array([len(data[p]) for p in sorted(data)], np.int64),
        np.zeros(len(data), np.int32),
        np.frombuffer(digests, np.uint8).reshape(-1, 32),
        np.ones(len(data), bool),
        report,
    )


def test_a_changed_file_is_named_with_both_hashes() -> None:
    split = _split({"train/n1/a.jpg": b"good", "train/n1/b.jpg": b"fine"})
    result = EngineResult("xnvme_block")
    outcome = np.zeros(2, np.uint8)
    verify_batch(result, split, outcome, [0, 1], [b"evil", b"fine"], [0, 1], [-1, 0])
    assert outcome.tolist() == [READ | BAD_BYTES, READ | BAD_LABEL]
    assert (result.mismatched, result.label_mismatched) == (1, 1)
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


def test_a_padded_repeat_is_checked_once_and_failures_are_counted_beyond_the_listing() -> None:
    data = {f"train/n1/{i:04d}.jpg": bytes([i % 256]) * 3 for i in range(LISTED + 50)}
    split = _split(data)
    result = EngineResult("python_file")
    outcome = np.zeros(len(split), np.uint8)
    index = [*range(len(split)), len(split) - 1]  # DALI pads the last batch with the last image
    verify_batch(result, split, outcome, index, [b"x"] * len(index), [0] * len(index), [-1] * len(index))
    assert result.mismatched == len(split)  # every image once, the padded repeat not again
    assert len(result.mismatches) == LISTED
    assert np.all(outcome == READ | BAD_BYTES)


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
    results[-1].mismatched = 1
    block_map = BlockMap.of(Path("/mnt/ds"), Path("/dev/loop3"), [("p", 1, [], "inline")])
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


def _paths(split: SplitView) -> list[str]:
    return list(split.iter_paths())


def test_the_sample_is_bounded_class_balanced_and_seeded(tmp_path: Path) -> None:
    counts = write_random_files(tmp_path, classes=5, per_class=4, nbytes=8)  # 4, 5, 6, 7, 8 rows per class
    split = load_split(tmp_path, "train", sample=13, seed=3)
    assert len(split) == 13
    assert split.sample.total == counts["train"] == 30
    assert not split.full
    per_class = np.bincount(split.labels, minlength=5)
    assert per_class.max() - per_class.min() <= 1  # 13 over 5 classes: 3, 3, 3, 2, 2
    assert (split.sample.balance["per_class_min"], split.sample.balance["per_class_max"]) == (2, 3)
    assert _paths(split) == sorted(_paths(split))
    assert _paths(load_split(tmp_path, "train", sample=13, seed=3)) == _paths(split)  # same seed, same images
    assert _paths(load_split(tmp_path, "train", sample=13, seed=4)) != _paths(split)


def test_a_sample_where_a_class_is_short_gives_its_share_to_the_others(tmp_path: Path) -> None:
    write_random_files(tmp_path, classes=3, per_class=1, nbytes=8)  # 1, 2, 3 rows per class
    split = load_split(tmp_path, "train", sample=5, seed=0)
    assert np.bincount(split.labels, minlength=3).tolist() == [1, 2, 2]


def test_sample_zero_or_larger_than_the_split_reads_every_row(tmp_path: Path) -> None:
    write_random_files(tmp_path, classes=3, per_class=2, nbytes=8, val_per_class=1)
    for sample in (0, 1000):
        split = load_split(tmp_path, "train", sample=sample)
        assert (split.full, len(split)) == (True, 9)
        assert _paths(split) == sorted(str(p.relative_to(tmp_path)) for p in tmp_path.glob("train/*/*.jpg"))
    assert planned_images(tmp_path, None, 0) == 12
    assert planned_images(tmp_path, None, 2) == 4
    assert planned_images(tmp_path, ["val"], 2) == 2


def test_the_split_columns_carry_labels_sizes_and_digests(tmp_path: Path) -> None:
    write_random_files(tmp_path, classes=2, per_class=3, nbytes=100)
    split = load_split(tmp_path, "train", sample=4)
    assert (split.paths.dtype.kind, split.sha256.shape, split.sha256.dtype) == ("S", (4, 32), np.uint8)
    for i, sample in enumerate(split.batch(0, len(split))):
        data = (tmp_path / sample.path).read_bytes()
        assert split.sha256[i].tobytes() == hashlib.sha256(data).digest()
        assert sample.size == split.sizes[i] == 100
        assert sample.label == split.classes.index(sample.path.split("/")[1])
    assert split.index_of([split.path(2), "train/nope/x.jpg"]).tolist() == [2, -1]


def test_cli_sample_defaults_to_the_bounded_size_and_takes_zero_for_every_file(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = build_parser()
    assert parser.parse_args(["validate", "xnvme", "/d"]).sample == defaults.CHECK_SAMPLE
    assert parser.parse_args(["validate", "xnvme", "/d", "--sample", "0"]).sample == 0
    with pytest.raises(SystemExit):
        parser.parse_args(["validate", "xnvme", "/d", "--sample", "-1"])
    with pytest.raises(SystemExit):
        parser.parse_args(["validate", "xnvme", "--help"])
    assert "0 reads every file" in " ".join(capsys.readouterr().out.split())
    assert CheckConfig().sample == defaults.CHECK_SAMPLE
