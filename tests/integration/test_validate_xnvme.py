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
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from imgest.sinks.files.layout import data_root
from imgest.sinks.files.sample import write_files_dataset
from imgest.validate.blockmap import BlockMap
from imgest.validate.check import READ, CheckConfig, ValidationError
from imgest.validate.dataset import load_splits
from imgest.validate.loopfs import LoopMount, LoopUnavailableError, copy_in, loop_mounted
from imgest.validate.runner import run_check
from imgest.validate.step import validate_xnvme_step
from imgest.validate.xnvme_lib import XnvmeUnavailableError, load
from tests.validate_fixtures import write_random_files

pytestmark = pytest.mark.slow
CFG = CheckConfig(batch_size=8, rounds=1, queue_depth=8, sample=0)
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
    expected = [p for split in load_splits(root) for p in split.iter_paths()]
    assert [r.engine for r in report.results] == list(ALL)
    for result in report.results:
        assert (result.engine, result.status, result.mismatches, result.label_mismatches) == (
            result.engine,
            "ok",
            [],
            [],
        )
        assert result.images == result.checked == len(expected)
        assert all(np.all(o == READ) for o in result.outcomes.values())
    block = report.result("xnvme_block")
    assert block is not None
    assert block.info["device"] == str(mounted.device)
    assert block.info["fallbacks"] == {}
    assert report.block_map is not None
    assert sorted(p.decode() for p in report.block_map.paths) == sorted(expected)
    assert not report.block_map.fallback.any()
    assert np.all(np.diff(report.block_map.offsets) > 0)  # every file has extents


def test_labels_equal_what_fn_readers_file_assigns(dataset: Path) -> None:
    from imgest.validate.engines import PythonFileEngine
    from imgest.validate.pipeline import external_pipeline, reference_pipeline, run_batches, samples_of

    for split in load_splits(dataset):
        n = len(split)
        ref = reference_pipeline(split.split_dir, 4, 1, False)
        dali = {}
        for _, out in run_batches(ref, -(-n // 4)):
            dali.update({f"{split.split}/{info}": label for _, label, info in samples_of(out)})
        ext = external_pipeline(PythonFileEngine(split.root).read_batch, lambda s=split: s.batches(4), 4, 1, False)
        ours = [label for _, out in run_batches(ext, None) for _, label, _ in samples_of(out)]
        assert len(set(dali.values())) == 3
        assert ours == [dali[p] for p in split.iter_paths()] == split.labels.tolist()


def test_planted_corruption_is_caught_by_every_engine(dataset: Path, mounted: LoopMount, xnvme_loaded: None) -> None:
    root = mounted.mountpoint / "corrupt"
    shutil.copytree(dataset, root)
    victim = load_splits(root)[0].batch(3, 4)[0]
    target = data_root(root) / victim.path  # the version folder the manifest names
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, same extents: only the bytes differ
    target.write_bytes(bytes(data))
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
    block_map = BlockMap.load(tmp_path / "block_map.npz", dataset)
    assert str(block_map.device).startswith("/dev/loop")
    assert sorted(p.decode() for p in block_map.paths) == sorted(
        p for split in load_splits(dataset) for p in split.iter_paths()
    )
    assert (doc["sample"], doc["checked"], doc["full"]) == (0, 24, True)


def test_cold_passes_drop_the_images_and_the_loop_image_from_the_cache_first(
    dataset: Path, tmp_path: Path, xnvme_loaded: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--cold: before every timed pass (engines and sweep) the checked images on the loop filesystem and the loop
    image behind them leave the page cache (spied: the real eviction runs); every engine still reads every byte."""
    if os.geteuid() != 0:
        pytest.skip("loop devices and mount need root")
    from imgest.validate import cache, check

    evicted: list[list[str]] = []

    def spy(paths: object) -> int:
        names = [str(p) for p in paths]  # type: ignore[attr-defined]
        evicted.append(names)
        return cache.evict(names)

    monkeypatch.setattr(check, "evict", spy)
    cfg = CheckConfig(batch_size=8, rounds=2, queue_depth=8, sample=0, cold=True)
    summary = validate_xnvme_step(dataset, tmp_path, config=cfg, loop_fs="ext4", sweep=[1, 8])
    if "xnvme_block" in summary["skipped"]:
        pytest.skip(summary["skipped"]["xnvme_block"])
    assert summary["cache"] == "cold"
    assert {e: v["status"] for e, v in summary["engines"].items()} == dict.fromkeys(ALL, "ok")
    splits = len(load_splits(dataset))
    # 4 engines x 2 timed rounds, then 2 xNVMe engines x 2 depths x 2 rounds, per split
    assert len(evicted) == (4 * 2 + 2 * 2 * 2) * splits
    image = str(tmp_path / "loopfs" / "ext4.img")
    assert all(names[-1] == image for names in evicted)
    assert {len(names) - 1 for names in evicted} <= {len(s) for s in load_splits(dataset)}
    assert all("/loopfs/mnt-ext4/" in name for names in evicted for name in names[:-1])
    doc = json.loads((tmp_path / "validate_xnvme.json").read_text())
    assert doc["config"]["cold"] is True
    assert doc["cache"].startswith("cold:")
    assert (tmp_path / "validate_xnvme-sweep.png").read_bytes()[:4] == b"\x89PNG"  # img/s against queue depth


def test_no_block_device_skips_the_block_engine_with_the_reason(dataset: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.major(os.stat(shm).st_dev) != 0:
        pytest.skip("no tmpfs at /dev/shm")
    root = shm / f"imgest-validate-{os.getpid()}"
    shutil.copytree(dataset, root)
    try:
        report = run_check(root, CheckConfig(batch_size=8, rounds=0, engines=("python_file", "xnvme_block"), sample=0))
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
    victim = load_splits(root)[0].batch(0, 1)[0]
    (data_root(root) / victim.path).write_bytes(b"not the ingested bytes")
    cfg = CheckConfig(batch_size=8, rounds=0, engines=("dali_file", "python_file"), sample=0)
    with pytest.raises(ValidationError, match=victim.sha256):
        validate_xnvme_step(root, tmp_path / "out", config=cfg)
    doc = json.loads((tmp_path / "out" / "validate_xnvme.json").read_text())
    assert {(m["engine"], m["path"]) for m in doc["mismatches"]} == {(e, victim.path) for e in cfg.engines}


REFERENCE_AND_FILE = ("dali_file", "python_file")


def test_a_sample_checked_in_place_reads_only_the_sample_and_says_so(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    write_random_files(root, classes=4, per_class=5, nbytes=3000, val_per_class=2)  # train 5..8 per class: 26
    cfg = CheckConfig(batch_size=4, rounds=1, engines=REFERENCE_AND_FILE, sample=6, seed=1)
    summary = validate_xnvme_step(root, tmp_path / "out", config=cfg)
    doc = json.loads((tmp_path / "out" / "validate_xnvme.json").read_text())
    assert (summary["sample"], summary["checked"], summary["full"]) == (6, 12, False)  # 6 train + 6 of 8 val
    assert (doc["sample"], doc["sample_seed"], doc["checked"], doc["full"]) == (6, 1, 12, False)
    train = doc["splits"]["train"]
    assert (train["split_rows"], train["checked"], train["full_read"]) == (26, 6, False)
    assert (train["balance"]["per_class_min"], train["balance"]["per_class_max"]) == (1, 2)
    chosen = {p for split in load_splits(root, sample=6, seed=1) for p in split.iter_paths()}
    for row in doc["engines"]:
        assert (row["engine"], row["status"], row["checked"], row["images"]) == (row["engine"], "ok", 12, 12)
    assert not (tmp_path / "out" / "block_map.npz").exists()  # no block engine asked for
    # DALI's own reader was pointed at the sample only: a changed file outside it goes unseen, one inside fails
    outside = next(p for p in root.glob("train/*/*.jpg") if str(p.relative_to(root)) not in chosen)
    outside.write_bytes(b"changed")
    assert validate_xnvme_step(root, tmp_path / "out2", config=cfg)["ok"]
    inside = root / sorted(chosen)[0]
    inside.write_bytes(b"changed")
    with pytest.raises(ValidationError, match=sorted(chosen)[0]):
        validate_xnvme_step(root, tmp_path / "out3", config=cfg)


def test_the_full_option_reads_every_file(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    counts = write_random_files(root, classes=3, per_class=4, nbytes=2000, val_per_class=3)
    report = run_check(root, CheckConfig(batch_size=4, rounds=0, engines=REFERENCE_AND_FILE, sample=0))
    on_disk = sorted(str(p.relative_to(root)) for p in root.glob("*/*/*.jpg"))
    assert len(on_disk) == sum(counts.values())
    assert sorted(p for split in report.splits for p in split.iter_paths()) == on_disk
    for result in report.results:
        assert result.checked == len(on_disk)
        assert all(np.all(o == READ) for o in result.outcomes.values())
    assert all(split.full for split in report.splits)


_MEASURE = """
import json, sys, tracemalloc
from pathlib import Path
import numpy as np
from imgest.validate.check import BAD_BYTES, READ, CheckConfig
from imgest.validate.runner import run_check
root, victim, batch, engines = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
cfg = CheckConfig(batch_size=batch, rounds=0, engines=tuple(engines), sample=0)
run_check(root, cfg)  # imports and DALI's first pipeline out of the measurement
tracemalloc.start()
report = run_check(root, cfg)
peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
bad = int(report.splits[0].index_of([victim])[0])
results = []
for result in report.results:
    outcome = result.outcomes["train"]
    results.append({"dtype": str(outcome.dtype), "shape": list(outcome.shape), "bad": int(outcome[bad]),
        "read": int(np.count_nonzero(outcome == READ)), "mismatched": result.mismatched, "checked": result.checked})
print(json.dumps({"peak": peak, "results": results, "flags": int(READ | BAD_BYTES)}))
"""


def test_a_dataset_many_batches_large_is_checked_without_keeping_its_bytes(tmp_path: Path) -> None:
    # Measured in a process of its own: tracemalloc counts every thread's allocations, and a reader an earlier
    # test left running in this process would count as the check's.
    root = tmp_path / "ds"
    nbytes, batch = 64_000, 4
    counts = write_random_files(root, classes=3, per_class=100, nbytes=nbytes)  # 303 files, 19 MB
    victim = sorted(root.glob("train/n00000001/*.jpg"))[7]
    victim.write_bytes(b"x" * nbytes)
    args = [str(root), str(victim.relative_to(root)), str(batch), json.dumps(list(REFERENCE_AND_FILE))]
    run = subprocess.run([sys.executable, "-c", _MEASURE, *args], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    dataset_bytes = counts["train"] * nbytes
    assert dataset_bytes > 60 * batch * nbytes
    assert got["peak"] < 12 * batch * nbytes, f"peak {got['peak']} bytes for a {dataset_bytes}-byte dataset"
    assert got["results"]
    for result in got["results"]:
        assert (result["dtype"], result["shape"]) == ("uint8", [counts["train"]])
        assert result["bad"] == got["flags"]
        assert result["read"] == counts["train"] - 1
        assert (result["mismatched"], result["checked"]) == (1, counts["train"])


def test_the_loop_copy_holds_only_the_sample(tmp_path: Path, xnvme_loaded: None) -> None:
    if os.geteuid() != 0:
        pytest.skip("loop devices and mount need root")
    root = tmp_path / "ds"
    write_random_files(root, classes=5, per_class=10, nbytes=20_000)  # 60 train files
    cfg = CheckConfig(batch_size=8, rounds=0, queue_depth=8, sample=10)
    summary = validate_xnvme_step(root, tmp_path / "out", config=cfg, loop_fs="ext4")
    if "xnvme_block" in summary["skipped"]:
        pytest.skip(summary["skipped"]["xnvme_block"])
    assert {e: v["status"] for e, v in summary["engines"].items()} == dict.fromkeys(ALL, "ok")
    assert (summary["checked"], summary["full"]) == (10, False)
    block_map = BlockMap.load(tmp_path / "out" / "block_map.npz", root)
    chosen = sorted(p for split in load_splits(root, sample=10) for p in split.iter_paths())
    assert sorted(p.decode() for p in block_map.paths) == chosen  # only the sample was copied and mapped
    doc = json.loads((tmp_path / "out" / "validate_xnvme.json").read_text())
    assert {r["engine"]: r["checked"] for r in doc["engines"]} == dict.fromkeys(ALL, 10)


def test_the_operator_reads_the_sample_the_request_asks_for(tmp_path: Path) -> None:
    from imgest.operators.validate import ValidateXnvmeOperator

    root = tmp_path / "ds"
    write_random_files(root, classes=3, per_class=4, nbytes=1000)  # 15 train files
    for sample, checked in (("5", 5), (0, 15)):  # a rendered template may be text; 0 reads every file
        op = ValidateXnvmeOperator(
            task_id="validate_xnvme",
            dataset_dir=str(root),
            out_dir=str(tmp_path / f"out{sample}"),
            loop_fs="ext4",  # as the DAG asks; where no loop mount may be made the block engine is skipped
            sample=sample,
        )
        summary = op.execute({})
        assert (summary["ok"], summary["checked"], summary["full"]) == (True, checked, checked == 15)
