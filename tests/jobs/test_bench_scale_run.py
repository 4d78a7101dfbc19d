"""`imgest bench scale` runs every step of a target for real and measures the processes that ran it. The Cassandra
target here; the shards target's bench steps run in tests/jobs/test_bench_scale_refresh.py, and both targets' DAG
steps in tests/dags (a second target here cost 19 s of the suite)."""

from __future__ import annotations

from pathlib import Path

import pytest

from imgest.bench import scale
from imgest.sources.devdata.countscale import CountScaleSpec, write_count_scale

pytestmark = pytest.mark.usefixtures("cassandra_server", "s3_server")


def test_every_step_runs_and_is_measured(tmp_path: Path) -> None:
    target = "cassandra"
    source = write_count_scale(tmp_path / "src", CountScaleSpec(classes=5, train=60, val=10), workers=1)
    rows = scale.run_size("count", "test", source, 70, target, tmp_path / "runs")
    steps = {r["step"]: r for r in rows}
    assert list(steps) == list(scale.STEPS[target])
    assert all(r["wall_s"] > 0 and r["rss"]["task"] > 20 << 20 for r in rows)
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
