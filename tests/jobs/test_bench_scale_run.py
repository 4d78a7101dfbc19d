"""`imgest bench scale` runs every step of a target for real and measures the processes that ran it. The Cassandra
target here; the shards target's bench steps run in tests/jobs/test_bench_scale_refresh.py, and both targets' DAG
steps in tests/dags (a second target here cost 19 s of the suite)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from imgest.bench import scale
from imgest.core import defaults
from imgest.core.settings import CassandraSettings, S3Settings
from imgest.readback.budget import check_seconds
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sinks.shards.store import open_store
from imgest.sources.devdata.countscale import CountScaleSpec, write_count_scale

pytestmark = pytest.mark.usefixtures("cassandra_server", "s3_server")


def test_every_step_runs_and_is_measured(tmp_path: Path) -> None:
    target = "cassandra"
    source = write_count_scale(tmp_path / "src", CountScaleSpec(classes=5, train=60, val=10), workers=1)
    t0 = time.perf_counter()
    rows = scale.run_size("count", "test", source, 70, target, tmp_path / "runs")
    elapsed = time.perf_counter() - t0
    steps = {r["step"]: r for r in rows}
    assert list(steps) == list(scale.STEPS[target])
    # each step's process tree spent CPU, and no more than its wall time on this machine's cores allows; the steps
    # ran one after another within the run this test timed
    cores = os.cpu_count() or 1
    assert all(0 < r["cpu_s"] <= r["wall_s"] * cores + 0.02 and r["rss"]["task"] > 20 << 20 for r in rows)
    assert sum(r["wall_s"] for r in rows) <= elapsed
    ingest = steps[f"ingest_{target}"]
    assert ingest["rss"]["spark_driver"] > 100 << 20  # the JVM of spark-submit was followed
    assert ingest["rss"]["driver_python"] > 20 << 20  # the job's Python driver
    assert ingest["rss"]["spark_worker"] > 20 << 20  # and the Python workers
    with cassandra_session(CassandraSettings.from_env()) as session:  # what the run's keyspace holds, byte for byte
        rows = session.execute("SELECT data FROM scale_count_test_cassandra.data")
        assert ingest["bytes_written"] == sum(len(row.data) for row in rows)
    assert "70 candidates in 5 classes" in steps["scan"]["result"]["summary"]
    verify = steps[f"verify_{target}"]["result"]
    assert verify["ok"] is True
    split = steps["build_split"]["result"]
    assert len(split["parts"]) == 2  # the default train/val ratios
    assert sum(split["parts"]) == 60  # every train row went into a part
    assert split["unused"] == 0
    read = steps["read_throughput"]["result"]
    assert read["checked"] == 60  # the whole train split compared byte for byte (smaller than the sample)
    assert read["full_read"] is True
    assert read["skipped"] == []
    assert set(read["readers"]) == {
        "cassandra/raw",
        "cassandra-simple/raw",
        "cassandra/train",
        "cassandra-simple/train",
    }
    for reader in read["readers"].values():  # 60 images: one batch each, start-up only, so no rate is claimed
        assert reader["images"] == 60
        assert reader["startup_s"] > 0
        assert reader["steady_rate"] is None


def test_count21k_tar_of_class_tars_on_s3_runs_every_step(tmp_path: Path) -> None:
    """The 21k-class dataset's shape (one tar of class tars, on the S3 source) through every shards step."""
    from imgest.sources.devdata.count21k import Count21kSpec, class_counts, fraction_counts

    spec = Count21kSpec(classes=30, images=150)
    made = scale.prepare_count21k([0.2, 1.0], spec, tmp_path / "tars", prefix=f"test-count21k-{tmp_path.name}")
    assert [(label, images) for label, _src, images in made] == [
        ("20pct", int(fraction_counts(spec, 0.2).sum())),
        ("100pct", int(class_counts(spec).sum())),
    ]
    assert made[1][1].startswith("s3://imgest-src/")
    assert made[1][1].endswith("/f1/winter21_whole.tar")
    target = "shards"
    rows = scale.run_size("count21k", "test", made[1][1], 150, target, tmp_path / "runs")
    steps = {r["step"]: r for r in rows}
    assert list(steps) == list(scale.STEPS[target])
    assert "150 candidates in 30 classes" in steps["scan"]["result"]["summary"]
    assert steps[f"verify_{target}"]["result"]["ok"] is True
    packed = steps[f"ingest_{target}"]
    assert packed["result"]["samples"] == {"train": 150}  # every image went in, none quarantined
    assert packed["result"]["quarantined"] == 0
    assert packed["bytes_written"] == packed["result"]["bytes"] == _shard_bytes(packed["result"]["dest"])
    read = steps["read_throughput"]["result"]  # within its share of the run before it, as in the DAG
    before = round(sum(r["wall_s"] for r in rows if r["step"] != "read_throughput"), 2)
    assert read["run_seconds"] == pytest.approx(before, abs=0.05)
    spent = read["task_seconds_before"]  # the step process's own start-up, which the run's share counts
    assert 0 < spent < 30
    assert read["budget_s"] == check_seconds(defaults.CHECK_SECONDS, read["run_seconds"], spent=spent)


def _shard_bytes(dest: str) -> int:
    """The sizes of the .tar objects the published manifest names, as the store lists them."""
    store = open_store(dest, S3Settings.from_env())
    named = {entry["path"] for entry in (store.read_manifest() or {})["shards"]}
    return sum(o.size for o in store.list_objects("") if o.name in named)
