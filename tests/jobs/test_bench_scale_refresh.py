"""`imgest bench scale --refresh` runs the refresh_<name> path for real at a tiny size: a first version, a refresh
without change (no job) and a seeded 0.1 % change, each sub-step measured in its own process. The shards target
only: the bench's phases, mutation and summaries do not depend on the target, and the Cassandra refresh itself is
tested through the refresh DAG and `imgest refresh` (a second target here cost 28 s of the suite)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from imgest.bench import scale, scale_refresh
from imgest.sources.devdata.countscale import CountScaleSpec, write_count_scale

pytestmark = pytest.mark.usefixtures("cassandra_server", "s3_server")


def test_refresh_mode_measures_first_nochange_and_change(tmp_path: Path) -> None:
    target = "shards"
    source = write_count_scale(tmp_path / "src", CountScaleSpec(classes=5, train=60, val=10), workers=1)
    files = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in source.rglob("*.JPEG")}
    t0 = time.perf_counter()
    rows = scale_refresh.run_refresh_size("count", "test", source, 70, target, tmp_path / "runs")
    elapsed = time.perf_counter() - t0
    expected = [step for phase in scale_refresh.PHASES for step in scale_refresh.steps(phase)]
    assert [r["step"] for r in rows] == expected
    assert not any(r["step"] == "refresh_nochange.ingest" for r in rows)  # no change: no Spark job
    # each step's process tree spent CPU, and no more than its wall time on this machine's cores allows; the steps
    # ran one after another within the run this test timed
    cores = os.cpu_count() or 1
    assert all(0 < r["cpu_s"] <= r["wall_s"] * cores + 0.02 and r["rss"]["task"] > 20 << 20 for r in rows)
    assert sum(r["wall_s"] for r in rows) <= elapsed
    steps = {r["step"]: r for r in rows}
    for phase in ("refresh_first", "refresh_change"):
        ingest = steps[f"{phase}.ingest"]
        assert ingest["rss"]["spark_driver"] > 100 << 20  # spark-submit's JVM was followed
        assert ingest["bytes_written"] is None or ingest["bytes_written"] > 0
    plans = {r["phase"]: r["result"] for r in rows if r["step"].endswith(".plan")}
    assert plans["refresh_first"]["counts"] == {"added": 70, "changed": 0, "removed": 0, "unchanged": 0}
    assert plans["refresh_nochange"]["changed"] is False
    assert plans["refresh_nochange"]["counts"]["unchanged"] == 70
    # 0.1 % of 70 images, at least one of each kind: exactly what the mutation did
    assert plans["refresh_change"]["counts"] == {"added": 1, "changed": 1, "removed": 1, "unchanged": 68}
    assert steps["refresh_change.plan"]["mutation"] == {"added": 1, "changed": 1, "removed": 1}
    finish = steps["refresh_change.finish"]["result"]
    assert finish["version"].endswith("-r2")
    assert finish["verification"]["ok"] is True
    assert steps["refresh_first.finish"]["result"]["version"].endswith("-r1")
    # the cached tree was never written; the private copy is gone
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in source.rglob("*.JPEG")} == files
    assert not (tmp_path / "runs" / f"scale-count-test-{target}-refresh" / "source").exists()
    summary = {s["phase"]: s for s in scale_refresh.summarize_refresh(rows)}
    assert summary["refresh_change"]["changed"] == [3]
    after_scan = sum(r["wall_s"] for r in rows if r["phase"] == "refresh_change" and not r["step"].endswith(".scan"))
    assert summary["refresh_change"]["s_per_changed_image"] == [round(after_scan / 3, 4)]  # 3 images changed
    assert summary["refresh_nochange"]["s_per_changed_image"] == [None]
    assert {s["step"] for s in scale.summarize(rows)} == set(expected)
