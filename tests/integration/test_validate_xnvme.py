"""The four read engines against a real loop-mounted filesystem (ext4, and XFS where mkfs.xfs is installed).

No Cassandra, S3 or Airflow. The loop mounts need root; where losetup or mount is refused the tests skip with the
reason. Assertions are on what was read: hashes, labels, the mismatch listing and the block map.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from imgest.sources.devdata.files_target import write_files_dataset
from imgest.validate.check import CheckConfig, ValidationError
from imgest.validate.dataset import load_splits
from imgest.validate.loopfs import LoopMount, LoopUnavailableError, copy_in, loop_mounted
from imgest.validate.runner import run_check
from imgest.validate.step import validate_xnvme_step
from imgest.validate.xnvme_lib import XnvmeUnavailableError, load

pytestmark = pytest.mark.slow
CFG = CheckConfig(batch_size=8, rounds=1, queue_depth=8)
ALL = ("dali_file", "python_file", "xnvme_file", "xnvme_block")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("files") / "ds"
    write_files_dataset(root, classes=3, per_class=6, val_per_class=2, large_every=0)
    return root


@pytest.fixture(scope="module")
def xnvme_loaded() -> None:
    try:
        load()
    except XnvmeUnavailableError as exc:
        pytest.skip(f"libxnvme is not available: {exc}")


@pytest.fixture(scope="module", params=["ext4", "xfs"])
def mounted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopMount]:
    if os.geteuid() != 0:
        pytest.skip("loop devices and mount need root")
    if request.param == "xfs" and shutil.which("mkfs.xfs") is None:
        pytest.skip("mkfs.xfs is not installed (apt-get install xfsprogs)")
    try:
        with loop_mounted(tmp_path_factory.mktemp(f"loop-{request.param}"), 400, request.param) as mount:
            yield mount
    except LoopUnavailableError as exc:
        pytest.skip(f"this machine forbids a loop-mounted filesystem: {exc}")


def test_all_four_engines_read_every_byte_and_label(dataset: Path, mounted: LoopMount, xnvme_loaded: None) -> None:
    root = copy_in(dataset, mounted)
    report = run_check(root, CFG)
    expected = {s.path: s.sha256 for split in load_splits(root) for s in split.samples}
    assert [r.engine for r in report.results] == list(ALL)
    for result in report.results:
        assert (result.engine, result.status, result.mismatches, result.label_mismatches) == (
            result.engine,
            "ok",
            [],
            [],
        )
        assert result.images == len(expected)
    block = report.result("xnvme_block")
    assert block is not None
    assert block.info["device"] == str(mounted.device)
    assert block.info["fallbacks"] == {}
    assert report.block_map is not None
    assert sorted(report.block_map.files) == sorted(expected)
    assert all(f.fallback is None and f.extents for f in report.block_map.files.values())


def test_labels_equal_what_fn_readers_file_assigns(dataset: Path) -> None:
    from imgest.validate.engines import PythonFileEngine
    from imgest.validate.pipeline import external_pipeline, reference_pipeline, run_batches, samples_of

    for split in load_splits(dataset):
        n = len(split.samples)
        ref = reference_pipeline(split.split_dir, 4, 1, False)
        dali = {}
        for _, out in run_batches(ref, -(-n // 4)):
            dali.update({f"{split.split}/{info}": label for _, label, info in samples_of(out)})
        ext = external_pipeline(PythonFileEngine(dataset).read_batch, split.samples, 4, 1, False)
        ours = [label for _, out in run_batches(ext, None) for _, label, _ in samples_of(out)]
        assert len(set(dali.values())) == 3
        assert ours == [dali[s.path] for s in split.samples]


def test_planted_corruption_is_caught_by_every_engine(dataset: Path, mounted: LoopMount, xnvme_loaded: None) -> None:
    root = mounted.mountpoint / "corrupt"
    shutil.copytree(dataset, root)
    victim = [s for split in load_splits(root) for s in split.samples][3]
    data = bytearray((root / victim.path).read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, same extents: only the bytes differ
    (root / victim.path).write_bytes(bytes(data))
    subprocess.run(["sync", "-f", str(root)], check=True)
    report = run_check(root, CFG)
    actual = hashlib.sha256(data).hexdigest()
    for result in report.results:
        assert result.status == "failed", result.engine
        assert result.mismatches == [
            {"engine": result.engine, "path": victim.path, "expected": victim.sha256, "actual": actual}
        ]
    assert not report.ok


def test_step_writes_report_plot_and_relative_block_map(dataset: Path, tmp_path: Path, xnvme_loaded: None) -> None:
    if os.geteuid() != 0:
        pytest.skip("loop devices and mount need root")
    summary = validate_xnvme_step(dataset, tmp_path, config=CFG, loop_fs="ext4", sweep=[1, 4])
    if "xnvme_block" in summary["skipped"]:
        pytest.skip(summary["skipped"]["xnvme_block"])
    assert {e: v["status"] for e, v in summary["engines"].items()} == dict.fromkeys(ALL, "ok")
    doc = json.loads((tmp_path / "validate_xnvme.json").read_text())
    assert {(r["engine"], r["queue_depth"]) for r in doc["queue_depth_sweep"]} == {
        (e, q) for e in ("xnvme_file", "xnvme_block") for q in (1, 4)
    }
    assert (tmp_path / "validate_xnvme.png").read_bytes()[:4] == b"\x89PNG"
    block_map = json.loads((tmp_path / "block_map.json").read_text())
    assert block_map["device"].startswith("/dev/loop")
    assert sorted(block_map["files"]) == sorted(s.path for split in load_splits(dataset) for s in split.samples)


def test_no_block_device_skips_the_block_engine_with_the_reason(dataset: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.major(os.stat(shm).st_dev) != 0:
        pytest.skip("no tmpfs at /dev/shm")
    root = shm / f"imgest-validate-{os.getpid()}"
    shutil.copytree(dataset, root)
    try:
        report = run_check(root, CheckConfig(batch_size=8, rounds=0, engines=("python_file", "xnvme_block")))
    finally:
        shutil.rmtree(root)
    block = report.result("xnvme_block")
    assert block is not None
    assert block.status == "skipped"
    assert "no block device" in (block.reason or "")
    assert report.ok


def test_step_fails_naming_the_changed_file(dataset: Path, tmp_path: Path) -> None:
    root = tmp_path / "ds"
    shutil.copytree(dataset, root)
    victim = load_splits(root)[0].samples[0]
    (root / victim.path).write_bytes(b"not the ingested bytes")
    cfg = CheckConfig(batch_size=8, rounds=0, engines=("dali_file", "python_file"))
    with pytest.raises(ValidationError, match=victim.sha256):
        validate_xnvme_step(root, tmp_path / "out", config=cfg)
    doc = json.loads((tmp_path / "out" / "validate_xnvme.json").read_text())
    assert {(m["engine"], m["path"]) for m in doc["mismatches"]} == {(e, victim.path) for e in cfg.engines}
