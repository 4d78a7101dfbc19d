"""`imgest bench connect` end to end at its tiny size: both routes run each job on the same cluster and input, and
the report holds what each measured (figures, not times, are asserted: the submitting side of spark-submit holds
the driver JVM, the Connect client does not)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imgest.services import CassandraServer, S3Server
from imgest.services.spark_connect import SparkConnectServer

pytestmark = [pytest.mark.services, pytest.mark.slow]


def test_bench_connect_reports_both_routes(
    spark_connect: SparkConnectServer, cassandra_server: CassandraServer, s3_server: S3Server, tmp_path: Path
) -> None:
    from imgest.cli import main

    out = tmp_path / "connect.json"
    assert main(["bench", "connect", "--sizes", "tiny", "--targets", "shards", "--json", str(out)]) == 0
    rows = {r["route"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"spark-submit", "connect", "connect-deferred"}
    for row in rows.values():
        assert row["images"] == 1000
        assert row["images_per_s"] > 0
        assert row["worker_cpu_s"] > 0
        assert "other_cores" in row["quiet"]
    assert rows["spark-submit"]["worker_peak_rss_mb"] > rows["connect"]["worker_peak_rss_mb"]  # the driver JVM
    deferred = rows["connect-deferred"]
    assert deferred["clients"] == 2  # the client that started the Spark call, and the one that took its results
    assert deferred["followed_s"] > 0  # the follower's wait: no client process on the worker meanwhile
    assert deferred["worker_held_s"] < deferred["wall_s"]
    assert rows["connect"]["worker_held_s"] == rows["connect"]["wall_s"]
    # each run's shards are measured, not kept (a 1.33 M run wrote 4.6 GB per route)
    listed = s3_server.settings().client().list_objects_v2(Bucket=s3_server.bucket, Prefix="bench/connect-")
    assert listed.get("KeyCount", 0) == 0, [o["Key"] for o in listed.get("Contents", [])][:5]
