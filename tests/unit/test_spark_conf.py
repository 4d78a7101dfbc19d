"""The Spark settings on the spark-submit command: a driver whose memory is flat in image and task count."""

from __future__ import annotations

from imgest.spark.submit import submit_command


def confs(cmd: list[str]) -> dict[str, str]:
    """The --conf KEY=VALUE pairs of a spark-submit argv, failing on a key given twice."""
    pairs = [cmd[i + 1].split("=", 1) for i, arg in enumerate(cmd) if arg == "--conf"]
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"a key is passed twice: {keys}"
    return dict(pairs)


def test_local_driver_heap_is_capped_and_the_manifest_read_in_small_splits() -> None:
    for master in ("local[*]", "local[2]", "local[2,4]", "local"):
        got = confs(submit_command("ingest_cassandra", ["--manifest-dir", "x"], master))
        assert got["spark.driver.memory"] == "512m"
        assert got["spark.sql.files.maxPartitionBytes"] == "1m"
        assert int(got["spark.ui.retainedTasks"]) <= 10_000
        assert int(got["spark.ui.retainedStages"]) <= 100
        assert int(got["spark.sql.ui.retainedExecutions"]) <= 100
        assert "spark.eventLog.enabled" not in got  # a test's or a cluster's spark-defaults.conf decides


def test_cluster_masters_keep_their_own_driver_and_split_sizes() -> None:
    cmd = submit_command("pack_shards", ["--manifest-dir", "x"], "spark://10.0.0.5:7077")
    got = confs(cmd)
    assert "spark.driver.memory" not in got  # spark-defaults.conf or the caller sizes a cluster's driver
    assert "spark.sql.files.maxPartitionBytes" not in got
    assert int(got["spark.ui.retainedTasks"]) <= 10_000  # the live UI store stays bounded on a cluster too
    assert cmd[cmd.index("--master") + 1] == "spark://10.0.0.5:7077"


def test_the_callers_conf_wins() -> None:
    conf = {"spark.driver.memory": "2g", "spark.ui.retainedTasks": "500"}
    got = confs(submit_command("write_files", ["--manifest-dir", "x"], "local[2]", conf))
    assert got["spark.driver.memory"] == "2g"
    assert got["spark.ui.retainedTasks"] == "500"
    assert got["spark.sql.files.maxPartitionBytes"] == "1m"
