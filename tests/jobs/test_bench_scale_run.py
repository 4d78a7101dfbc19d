"""`imgest bench scale` runs every step of a target for real and measures the processes that ran it. The Cassandra
target here; the shards target's bench steps run in tests/jobs/test_bench_scale_refresh.py, and both targets' DAG
steps in tests/dags (a second target here cost 19 s of the suite)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from imgest.bench import scale
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
    assert ingest["bytes_written"] > 0
    assert "70 candidates in 5 classes" in steps["scan"]["result"]["summary"]
    verify = steps[f"verify_{target}"]["result"]
    assert verify["ok"] is True
    assert steps["build_split"]["result"]["parts"]
    assert steps["read_throughput"]["result"]
