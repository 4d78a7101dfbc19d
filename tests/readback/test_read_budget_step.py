"""The read_throughput step within a tiny time budget, against the real S3 server and Cassandra: every reader the
report names is measured, every image each one read is verified, and each reader the budget cut says so, with the
rate that sized what it read; DALI's s3:// leg reads with the shards' indexes and is reported with why it is slow."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from imgest.core import defaults
from imgest.flow.steps import read_throughput
from imgest.readback.check import DALI_S3_NOTE, ReadCheckOptions
from imgest.readback.pipelines import dali_available
from imgest.readback.step import read_throughput_step
from tests.readback.conftest import DATASET, KEYSPACE, step_settings

pytestmark = [pytest.mark.services, pytest.mark.slow]
BATCH = 8
# 0.05 s for the whole check: spent before the first reader starts (choosing the sample), so each reader gets a
# share of 0 s and reads its minimum, two batches, of the sample
TINY = ReadCheckOptions(sample=0, batch_size=BATCH, num_threads=1, seconds=0.05, min_batches=2)
S3_READERS = ("shards-s3-dali", "shards-s3-stream", "shards-s3-webdataset")
CASSANDRA_READERS = ("cassandra", "cassandra-simple")


def _report(out: Path) -> dict[str, Any]:
    return json.loads((out / "read_throughput.json").read_text())


def _check_cut(report: dict[str, Any], readers: tuple[str, ...], modes: tuple[str, ...]) -> None:
    """Every reader of READERS measured in each of MODES, each cut to its two batches and verified."""
    rows = report["readers"]
    assert {(r["reader"], r["mode"]) for r in rows} == {(n, m) for n in readers for m in modes}
    assert report["skipped"] == []
    assert report["budget_s"] == TINY.seconds
    assert sorted(report["budget_cut"]) == sorted(f"{n}/{m}" for n in readers for m in modes)
    for r in rows:
        where = (r["reader"], r["mode"], r["problems"])
        assert r["ok"], where
        assert r["images"] == r["images_verified"] == 2 * BATCH, where  # what it read, each image checked
        assert r["budget_cut"] is True, where
        assert r["planned"] == 2 * BATCH, where
        assert r["unread"] == report["checked"] - 2 * BATCH, where
        assert r["budget_rate"] > 0, where
        assert r["images_per_s"] > 0, where
        assert f"at {r['budget_rate']:.1f} images/s" in r["reason"], where


def test_s3_shard_check_within_a_tiny_budget(
    stored: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if not dali_available():
        pytest.skip("the DALI readers are what this test measures: pip install 'imgest[dali]'")
    with caplog.at_level(logging.WARNING, logger="imgest.readback.check"):
        out = read_throughput_step("shards", stored["s3"], tmp_path, step_settings(stored), TINY)
    report = _report(tmp_path)
    assert report["checked"] == stored["train"]  # the sample: every train image; each reader read 16 of them
    _check_cut(report, S3_READERS, TINY.modes)
    assert out["budget_cut"] == report["budget_cut"]
    assert out["seconds"] == report["seconds"] > 0
    for row in report["readers"]:
        if row["reader"] == "shards-s3-dali":  # DALI's own s3:// reader, given the .idx beside each of the 4 shards
            assert row["settings"]["index_paths"] == row["settings"]["shards"] == 4
            assert row["settings"]["batch_size"] == min(BATCH, defaults.CHECK_DALI_S3_BATCH)
            assert row["note"] == DALI_S3_NOTE
            assert row["reason"].endswith(DALI_S3_NOTE)
            assert "NVIDIA/DALI #5551" in row["reason"]
        else:
            assert row["note"] == ""
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("shards-s3-dali")]
    assert len(logged) == len(TINY.modes)
    assert all("images/s" in line and "16 of 60 images" in line and "cut" in line for line in logged), logged


def test_dali_s3_reader_reads_small_batches(stored: dict[str, Any], tmp_path: Path) -> None:
    """DALI's s3:// leg reads batches of at most CHECK_DALI_S3_BATCH (its blocking requests one after another
    give the same rate at any batch size), so its minimum of two batches fits its share; the other readers keep
    the check's batch size."""
    if not dali_available():
        pytest.skip("the DALI readers are what this test measures: pip install 'imgest[dali]'")
    big = defaults.CHECK_DALI_S3_BATCH + 8  # two of them (48) still under the 60 train images
    opts = replace(TINY, batch_size=big, modes=("raw",))
    read_throughput_step("shards", stored["s3"], tmp_path, step_settings(stored), opts)
    rows = {r["reader"]: r for r in _report(tmp_path)["readers"]}
    dali = rows["shards-s3-dali"]
    assert dali["settings"]["batch_size"] == defaults.CHECK_DALI_S3_BATCH
    assert dali["images"] == dali["images_verified"] == 2 * defaults.CHECK_DALI_S3_BATCH
    assert rows["shards-s3-stream"]["images"] == 2 * big


def test_cassandra_check_within_a_tiny_budget(stored: dict[str, Any], tmp_path: Path) -> None:
    modes = TINY.modes if dali_available() else ("raw",)
    read_throughput_step("cassandra", "", tmp_path, step_settings(stored), replace(TINY, modes=modes))
    _check_cut(_report(tmp_path), CASSANDRA_READERS, modes)


def test_the_dag_step_keeps_the_check_to_its_share_of_the_run(stored: dict[str, Any], tmp_path: Path) -> None:
    conf = {"source": "/unused", "dataset": DATASET, "target": "cassandra", "keyspace": KEYSPACE, "check_sample": 30}
    # 60 s of run before the check: 10 % of the run with it is 6.7 s; the default check_seconds (60) is not reached
    out = read_throughput(conf, tmp_path, stored["cassandra"], None, run_seconds=60.0)
    assert out["budget_s"] == 6.7
    report = _report(tmp_path)
    assert report["budget_s"] == 6.7
    # 30 images: two batches of 64 hold them all, so nothing is cut and each reader read the whole sample
    assert out["budget_cut"] == []
    assert report["checked"] == 30
    assert all(r["ok"] and r["images"] == 30 and not r["budget_cut"] for r in report["readers"])
    # the readers share 90 % of it (the rest is kept for the report): the first a quarter of what was left when it
    # started, each later one what the ones before it left over the readers still to run
    assert 0 < report["readers"][0]["budget_s"] <= 6.7 * 0.9 / 4
    assert all(r["budget_s"] <= 6.7 * 0.9 for r in report["readers"])
    out = read_throughput({**conf, "check_seconds": 0}, tmp_path, stored["cassandra"], None, run_seconds=60.0)
    assert out["budget_s"] == 0.0  # 0: no budget, whatever the run
    assert all(r["budget_s"] == 0.0 and not r["budget_cut"] for r in _report(tmp_path)["readers"])
