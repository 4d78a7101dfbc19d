"""`imgest bench scale --dag`: the trigger conf of each run, the node's OutOfMemoryError lines after a run's start,
the printed rows, the sampler's peaks; and the sampler against the real node's JMX."""

from __future__ import annotations

from pathlib import Path

import pytest

from imgest.bench.node_memory import NodeMemory
from imgest.bench.scale_dag import dag_conf, oom_lines, summary_rows


def test_each_target_is_the_dag_with_its_defaults_but_names_and_write_path() -> None:
    auto = dag_conf("cassandra", "100pct", Path("/d"), "b")
    assert auto == {
        "source": "/d",
        "layout": "cls-loc",
        "dataset": "dag-100pct-cassandra",
        "target": "cassandra",
        "keyspace": "dag_100pct_cassandra",
        "write_path": "auto",
    }
    assert dag_conf("cassandra-cql", "1pct", Path("/d"), "b")["write_path"] == "cql"
    shards = dag_conf("shards", "1pct", Path("/d"), "b")
    assert shards["s3_dest"] == "s3://b/dag-1pct-shards"
    assert "write_path" not in shards


def test_only_out_of_memory_lines_after_the_runs_start_count(tmp_path: Path) -> None:
    log = tmp_path / "system.log"
    log.write_text("ERROR old java.lang.OutOfMemoryError: Direct buffer memory\n")
    start = log.stat().st_size
    with log.open("a") as fh:
        fh.write("INFO fine\nERROR [ReadStage-3] java.lang.OutOfMemoryError: Cannot reserve 262144 bytes\n")
    assert oom_lines(log, start) == ["ERROR [ReadStage-3] java.lang.OutOfMemoryError: Cannot reserve 262144 bytes"]
    assert oom_lines(tmp_path / "none.log", 0) == []


def test_a_run_is_green_only_with_the_node_alive_and_no_oom() -> None:
    run = {
        "target": "cassandra",
        "images": 10,
        "ok": True,
        "wall_s": 9.0,
        "tasks": [{"task": "ingest_cassandra", "state": "success", "seconds": 5.0}],
        "read_back_share": 0.1,
        "node": {"peak_heap_mib": 1, "peak_direct_mib": 2, "peak_sstables": {"k.data": 3, "k.metadata": 4}},
        "node_answers_after": True,
        "node_oom_lines": [],
    }
    assert summary_rows([run])[0]["ok"] == "yes"
    assert summary_rows([run])[0]["sstables"] == "3/4"
    assert summary_rows([run])[0]["ingest_s"] == 5.0
    assert summary_rows([{**run, "node_oom_lines": ["x"]}])[0]["ok"] == "NO"
    assert summary_rows([{**run, "node_answers_after": False}])[0]["ok"] == "NO"


def test_the_sampler_keeps_peaks_and_the_largest_sstable_count() -> None:
    node = NodeMemory("nowhere:1")
    for heap, direct, count in ((5, 7, 3), (9, 2, 8), (1, 1, 2)):
        node.take({"heap": heap << 20, "heap_max": 64 << 20, "direct": direct << 20, "sstables": {"k.t": count}})
    node.take({"error": "ConnectException"})
    got = node.summary()
    assert (got["peak_heap_mib"], got["peak_direct_mib"], got["heap_max_mib"]) == (9, 7, 64)
    assert got["sstables"] == {"k.t": 2}
    assert got["peak_sstables"] == {"k.t": 8}
    assert (got["samples"], got["sample_errors"]) == (3, 1)


@pytest.mark.services
def test_the_sampler_reads_the_real_nodes_memory_and_sstables(cassandra_server: object) -> None:
    import time

    from imgest.services.cassandra import CassandraServer

    assert isinstance(cassandra_server, CassandraServer)
    with NodeMemory(f"127.0.0.1:{cassandra_server.jmx_port}", ["system.local", "no_such.table"], 100) as node:
        deadline = time.monotonic() + 60
        while node.samples < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
    got = node.summary()
    assert got["samples"] >= 3
    assert abs(got["heap_max_mib"] - (cassandra_server.heap >> 20)) <= 16  # G1 rounds the heap to its 16 MiB regions
    assert got["peak_heap_mib"] > 0
    assert got["peak_direct_mib"] > 0
    assert got["sstables"]["system.local"] >= 1
    assert got["sstables"]["no_such.table"] is None
