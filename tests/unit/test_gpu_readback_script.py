"""scripts/gpu_readback_check.py: the service-free read-back check that proves DALI `mixed` decoding on a GPU.

Here its CPU half runs (no GPU on CI): generated files and shards, every reader exact in raw and train mode.
Its GPU half ran on an H100 (docs/bench/gpu-readback.json); the gpu-marked test repeats it wherever a GPU is.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from imgest.core.paths import PACKAGE_DIR
from imgest.readback.pipelines import cuda_devices

SCRIPT = PACKAGE_DIR.parent / "scripts" / "gpu_readback_check.py"


def _run(tmp_path: Path, *extra: str) -> tuple[int, dict]:
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--json", str(out), "--work", str(tmp_path / "work"), *extra],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.is_file(), proc.stderr[-2000:]
    return proc.returncode, json.loads(out.read_text())


def test_cpu_half_reads_every_generated_image_exactly(tmp_path: Path) -> None:
    rc, report = _run(tmp_path, "--cpu-only", "--per-class", "4", "--classes", "3", "--repeats", "1")
    assert rc == 0, report["problems"]
    assert report["ok"]
    assert not report["problems"]
    runs = report["runs"]
    assert {(r["reader"], r["mode"]) for r in runs} == {
        (reader, mode) for reader in ("files", "shards-folder") for mode in ("raw", "train")
    }
    for r in runs:
        assert r["device"] == "cpu"
        assert r["ok"], r["problems"]
        assert r["images"] == r["expected_images"] == 12


@pytest.mark.gpu
@pytest.mark.skipif(cuda_devices() == 0, reason="needs an NVIDIA GPU for DALI's mixed decoder")
def test_mixed_decoding_matches_cpu_decoding(tmp_path: Path) -> None:
    rc, report = _run(tmp_path, "--per-class", "10", "--repeats", "2")
    assert rc == 0, report["problems"]
    assert {r["device"] for r in report["runs"]} == {"cpu", "gpu"}
    assert report["pixel_check"]["worst_image_mean_abs_diff"] <= report["pixel_check"]["limit"]
