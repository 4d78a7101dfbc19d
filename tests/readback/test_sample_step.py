"""The read_throughput step reads a seeded, class-balanced sample by default, every row with sample 0: against
the real Cassandra and S3, through the same DALI pipelines, each report saying exactly what it checked."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from imgest.flow.checks import check_version
from imgest.readback.check import ReadCheckOptions
from imgest.readback.step import read_throughput_step
from imgest.sinks.shards.store import open_store
from tests.readback.conftest import DATASET, KEYSPACE, step_settings

pytestmark = [pytest.mark.services, pytest.mark.slow]
OPTS = ReadCheckOptions(batch_size=8)


def _report(out: Path) -> dict[str, Any]:
    return json.loads((out / "read_throughput.json").read_text())


def test_cassandra_step_checks_the_sample_then_every_row(stored: dict[str, Any], tmp_path: Path) -> None:
    out = read_throughput_step("cassandra", "", tmp_path, step_settings(stored), replace(OPTS, sample=12))
    report = _report(tmp_path)
    assert out["checked"] == report["checked"] == report["sample"] == 12  # 3 classes x 20 train images stored
    assert report["split_rows"] == stored["train"]
    assert report["full_read"] is False
    assert report["balance"]["per_class"] == {"0": 4, "1": 4, "2": 4}
    assert 0 < report["scanned_share"] < 1  # chosen from a share of the ring, by the version record's class counts
    assert {(r["reader"], r["mode"]) for r in report["readers"]} == {
        (reader, mode) for reader in ("cassandra", "cassandra-simple") for mode in ("raw", "train")
    }
    assert all(r["ok"] and r["images"] == 12 for r in report["readers"])

    read_throughput_step("cassandra", "", tmp_path, step_settings(stored), replace(OPTS, sample=0, modes=("raw",)))
    report = _report(tmp_path)
    assert report["sample"] == 0
    assert report["full_read"] is True
    assert report["scanned_share"] == 1.0
    assert report["checked"] == stored["train"]
    assert all(r["ok"] and r["images"] == stored["train"] for r in report["readers"])


def test_files_and_s3_shard_steps_check_their_samples(stored: dict[str, Any], copy_of: Any, tmp_path: Path) -> None:
    files = copy_of(stored["files"])
    read_throughput_step("files", str(files), tmp_path, step_settings(stored), replace(OPTS, sample=9))
    report = _report(tmp_path)
    assert report["checked"] == 9
    assert report["balance"]["per_class"] == {"0": 3, "1": 3, "2": 3}
    assert [(r["reader"], r["images"], r["ok"]) for r in report["readers"]] == [("files", 9, True)] * 2

    manifest = open_store(stored["s3"], stored["s3_settings"]).read_manifest()
    sizes = {s["name"]: s["samples"] for s in manifest["shards"] if s["split"] == "train"}
    opts = replace(OPTS, sample=20)
    read_throughput_step("shards", stored["s3"], tmp_path, step_settings(stored), opts)
    report = _report(tmp_path)
    shards, unit = int(report["sample_unit"].split("(")[1].split()[0]), report["sample_unit"]
    assert unit.startswith("whole shards")
    assert shards < len(sizes)
    assert 20 <= report["checked"] < stored["train"]
    assert not report["full_read"]
    assert sum(report["balance"]["per_class"].values()) == report["checked"]
    assert report["checked"] in {sum(sorted(sizes.values())[i:j]) for i in range(5) for j in range(i, 5)}
    assert all(r["ok"] and r["images"] == report["checked"] for r in report["readers"]), report["readers"]


def test_refresh_check_reads_the_requests_sample(stored: dict[str, Any]) -> None:
    conf = {"source": "/unused", "dataset": DATASET, "target": "cassandra", "keyspace": KEYSPACE, "check_sample": 6}
    result = check_version({"conf": conf, "version": "v-sample"}, stored["cassandra"], None)
    assert result["read_throughput"]["checked"] == 6
    assert result["read_throughput"]["sample"] == 6
    report = json.loads(Path(result["read_throughput"]["report"]).read_text())
    assert report["balance"]["per_class"] == {"0": 2, "1": 2, "2": 2}
    every = check_version({"conf": conf, "version": "v-sample"}, stored["cassandra"], None, sample=0)
    assert every["read_throughput"]["checked"] == stored["train"]
    assert every["read_throughput"]["full_read"]
