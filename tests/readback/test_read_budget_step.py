"""The read_throughput step within its time budget, against the real S3 server and Cassandra: every reader the
report names is measured, every image each one read is verified; with a budget spent before the readers start the
check starts no reader whose start-up and least window would end past the deadline, saying so; with room, each
reads its warm-up and window and reports a steady rate apart from its start-up; DALI's s3:// leg reads with the
shards' indexes and says why it is slow."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from imgest.core import defaults
from imgest.flow.steps import read_throughput
from imgest.readback import budget
from imgest.readback.check import ReadCheckOptions
from imgest.readback.dali_s3 import DALI_S3_NOTE
from imgest.readback.pipelines import dali_available
from imgest.readback.step import read_throughput_step
from tests.readback.conftest import DATASET, KEYSPACE, step_settings

pytestmark = [pytest.mark.services, pytest.mark.slow]
BATCH = 8
# 0.05 s for the whole check: spent before the first reader starts (choosing the sample), so no reader is started
# (its start-up and least window would end past the deadline; DALI's s3:// reader: its reserve is not kept)
TINY = ReadCheckOptions(sample=0, batch_size=BATCH, num_threads=1, seconds=0.05)
CASSANDRA_READERS = ("cassandra", "cassandra-simple")


def _report(out: Path) -> dict[str, Any]:
    return json.loads((out / "read_throughput.json").read_text())


def _check_cut(
    report: dict[str, Any], readers: tuple[str, ...], modes: tuple[str, ...], not_run: tuple[str, ...] = ()
) -> None:
    """Every reader of READERS measured in each of MODES, each stopped after one batch, verified, its rate marked
    as not a steady one; those of NOT_RUN (a start-up of seconds) not started, the check's budget being spent."""
    rows = report["readers"]
    assert {(r["reader"], r["mode"]) for r in rows} == {(n, m) for n in readers for m in modes}
    assert sorted(line.split(": not run: ")[0] for line in report["skipped"]) == sorted(
        f"{n} ({m})" for n in not_run for m in modes
    )
    for line in report["skipped"]:  # DALI's s3:// reader: its reserve not kept, the budget affording no turn of it
        why = "cannot keep the 13.5 s a turn of it needs" if line.startswith("shards-s3-dali") else "was spent before"
        assert f"the check's 0.1 s budget {why}" in line, line
    assert report["budget_s"] == TINY.seconds
    everyone = sorted(f"{n}/{m}" for n in readers for m in modes)
    assert sorted(report["budget_cut"]) == everyone
    assert sorted(report["not_steady"]) == everyone
    for r in rows:
        where = (r["reader"], r["mode"], r["problems"])
        assert r["ok"], where
        # one batch: DALI's s3:// reader's is one of each of its pipelines (4 parts of 15 train images)
        batch = r["settings"].get("batch_size", BATCH) * r["settings"].get("readers", 1)
        assert r["images"] == r["images_verified"] == batch, where  # what it read, each image checked
        assert r["budget_cut"] is True, where
        assert r["stop"] == budget.CHECK_SPENT, where
        assert r["unread"] == report["checked"] - batch, where
        assert r["steady"] is False, where
        assert r["steady_batches"] == 0, where
        assert r["rate_note"].startswith("not a steady rate: 0 batches measured"), where
        assert r["startup_s"] > 0, where
        assert r["reason"].startswith("the check's "), where
        assert f" was spent: read {batch} of the" in r["reason"], where


def test_s3_shard_check_within_a_tiny_budget(
    stored: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if not dali_available():
        pytest.skip("the DALI readers are what this test measures: pip install 'imgest[dali]'")
    with caplog.at_level(logging.WARNING, logger="imgest.readback.check"):
        out = read_throughput_step("shards", stored["s3"], tmp_path, step_settings(stored), TINY)
    report = _report(tmp_path)
    assert report["checked"] == stored["train"]  # the sample: every train image
    # no reader is started with less than its start-up and its least window left before the check's deadline (a
    # figure over less is start-up, not a rate): the check keeps to its budget and says which it could not measure
    not_run = ("shards-s3-stream", "shards-s3-webdataset", "shards-s3-dali")
    _check_cut(report, (), TINY.modes, not_run=not_run)
    assert report["readers"] == []
    assert out["budget_cut"] == report["budget_cut"]
    assert out["seconds"] == report["seconds"] > 0
    assert out["skipped"] == report["skipped"]
    assert all(row["note"] == "" for row in report["readers"])
    assert not [r for r in caplog.records if r.getMessage().startswith("shards-s3-dali (")]
    not_started = [r.getMessage() for r in caplog.records if ": not run: " in r.getMessage()]
    assert len(not_started) == 2 * len(TINY.modes)  # the task log says which readers it could not measure


def test_dali_s3_reader_reads_small_batches(
    stored: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """DALI's s3:// leg reads batches of at most CHECK_DALI_S3_BATCH (its blocking requests one after another
    give the same rate at any batch size), so its warm-up and window take seconds; with room it runs last, with the
    .idx beside each shard, and logs its rate and why it is slow."""
    if not dali_available():
        pytest.skip("the DALI readers are what this test measures: pip install 'imgest[dali]'")
    big = defaults.CHECK_DALI_S3_BATCH + 8
    opts = replace(TINY, batch_size=big, modes=("raw",), seconds=60.0)
    with caplog.at_level(logging.WARNING, logger="imgest.readback.check"):
        read_throughput_step("shards", stored["s3"], tmp_path, step_settings(stored), opts)
    report = _report(tmp_path)
    rows = {r["reader"]: r for r in report["readers"]}
    assert [r["reader"] for r in report["readers"]][-1] == "shards-s3-dali"  # last, over what the others left
    dali = rows["shards-s3-dali"]
    assert dali["settings"]["index_paths"] == dali["settings"]["shards"] == 4  # the .idx beside each shard
    assert dali["note"] == DALI_S3_NOTE
    assert "NVIDIA/DALI #5551" in dali["note"]
    assert rows["shards-s3-stream"]["note"] == ""
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("shards-s3-dali (raw): ")]
    assert len(logged) == 1, logged
    assert "60 of 60 images read and verified" in logged[0], logged
    assert dali["settings"]["batch_size"] == defaults.CHECK_DALI_S3_BATCH
    parts = [15] * defaults.CHECK_DALI_S3_READERS  # its pipelines' parts of the 60 train images
    assert dali["settings"]["readers"] == len(parts)
    assert dali["images"] == dali["images_verified"] == sum(min(defaults.CHECK_DALI_S3_BATCH, p) for p in parts)
    assert rows["shards-s3-stream"]["images"] == 60


def test_cassandra_check_within_a_tiny_budget(stored: dict[str, Any], tmp_path: Path) -> None:
    modes = TINY.modes if dali_available() else ("raw",)
    read_throughput_step("cassandra", "", tmp_path, step_settings(stored), replace(TINY, modes=modes))
    # a Cassandra reader is not started with less than READER_STARTUP_S left: its connection and first batch would
    # end past the check's deadline (the 143 k check took 6.8 s of 4.2 when each read a batch)
    _check_cut(_report(tmp_path), (), modes, not_run=CASSANDRA_READERS)


def test_the_dag_step_keeps_the_check_to_its_share_of_the_run_only_from_its_image_count(
    stored: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = {"source": "/unused", "dataset": DATASET, "target": "cassandra", "keyspace": KEYSPACE, "check_sample": 30}
    # 60 s of run before the check, 60 train images: under CHECK_SHARE_FROM_IMAGES the cap holds (10 % of a short
    # run buys no measurement)
    out = read_throughput(conf, tmp_path, stored["cassandra"], None, run_seconds=60.0)
    assert out["budget_s"] == defaults.CHECK_SECONDS
    assert _report(tmp_path)["budget_s"] == defaults.CHECK_SECONDS
    # the same kind of run counted as a large one: 10 % of a 180 s run with the check in it is 20 s (room for each
    # reader's turn on a loaded machine too: choosing the sample and importing DALI count, 2-5 s under load)
    monkeypatch.setattr(defaults, "CHECK_SHARE_FROM_IMAGES", 50)
    out = read_throughput(conf, tmp_path, stored["cassandra"], None, run_seconds=180.0)
    assert out["budget_s"] == 20.0
    report = _report(tmp_path)
    assert report["budget_s"] == 20.0
    assert report["skipped"] == []
    assert len(report["readers"]) == 4
    # 30 images: one batch of 64 holds them all, so nothing is cut, each reader read the whole sample, and none
    # has a steady rate (its sample ended in its warm-up): the summary gives it no throughput
    assert out["budget_cut"] == []
    assert report["checked"] == 30
    assert all(r["ok"] and r["images"] == 30 and not r["budget_cut"] for r in report["readers"])
    assert all(v["steady_rate"] is None and v["startup_s"] > 0 for v in out["readers"].values())
    # the readers share 90 % of it (the rest is kept for the report): the first a quarter of what was left when it
    # started, each later one what the ones before it left over the readers still to run
    assert 0 < report["readers"][0]["budget_s"] <= 20.0 * 0.9 / 4
    assert all(r["budget_s"] <= 20.0 * 0.9 for r in report["readers"])
    out = read_throughput({**conf, "check_seconds": 0}, tmp_path, stored["cassandra"], None, run_seconds=60.0)
    assert out["budget_s"] == 0.0  # 0: no budget, whatever the run
    assert all(r["budget_s"] == 0.0 and not r["budget_cut"] for r in _report(tmp_path)["readers"])


@pytest.mark.parametrize("target", ["shards-s3", "cassandra"])
def test_with_room_every_reader_reads_its_window_and_reports_a_steady_rate(
    stored: dict[str, Any], tmp_path: Path, target: str
) -> None:
    """Batches of 1 over the 60 train images (DALI's s3:// reader: 1 of each of its 4 pipelines): 15 batches or
    more, over a warm-up and a window; with a minute each reader reads both, and its steady rate spans at least the
    window, measured after its start-up."""
    small = replace(TINY, batch_size=1, seconds=60.0, modes=("raw",))
    where = ("shards", stored["s3"]) if target == "shards-s3" else ("cassandra", "")
    out = read_throughput_step(*where, tmp_path, step_settings(stored), small)
    report = _report(tmp_path)
    assert report["not_steady"] == []
    assert report["window_batches"] == defaults.CHECK_WINDOW_BATCHES
    assert report["readers"]
    for r in report["readers"]:
        where_ = (r["reader"], r["stop"], r["problems"])
        size = r["settings"].get("batch_size", 1) * r["settings"].get("readers", 1)
        assert r["ok"], where_
        assert r["steady"], where_
        assert r["warmup_batches"] == defaults.CHECK_WARMUP_BATCHES, where_
        assert r["steady_batches"] >= defaults.CHECK_WINDOW_BATCHES, where_
        assert r["images"] >= (defaults.CHECK_WARMUP_BATCHES + defaults.CHECK_WINDOW_BATCHES) * size, where_
        assert r["stop"] in (budget.RATE_STEADY, budget.SAMPLE_READ), where_
        assert r["steady_rate"] > 0, where_
        assert r["startup_s"] > 0, where_
        assert out["readers"][f"{r['reader']}/raw"]["steady_rate"] == r["steady_rate"], where_
