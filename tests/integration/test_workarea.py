"""A dataset's work folder carried between two "hosts" (two local folders) through the S3 store: what one pushes
the other pulls, changes and deletions included; unchanged files move once."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import pytest

from imgest.core.workarea import WorkArea
from imgest.services.s3 import S3Server

pytestmark = pytest.mark.services


def test_two_hosts_see_each_others_writes_changes_and_deletions(s3_server: S3Server, tmp_path: Path) -> None:
    url = f"s3://{s3_server.bucket}/tests/workarea-{secrets.token_hex(4)}"
    a = WorkArea(tmp_path / "a", "ds", url, s3_server.settings())
    b = WorkArea(tmp_path / "b", "ds", url, s3_server.settings())
    (tmp_path / "a" / "refresh").mkdir(parents=True)
    (tmp_path / "a" / "manifest.parquet").write_bytes(b"m" * 10_000)
    (tmp_path / "a" / "refresh" / "state.json").write_text('{"v": 1}')
    assert a.push() == (2, 0)
    assert a.push() == (0, 0)  # nothing changed: nothing sent again

    assert b.pull() == 2
    assert (tmp_path / "b" / "manifest.parquet").read_bytes() == b"m" * 10_000
    assert b.pull() == 0  # already here: nothing fetched again
    (tmp_path / "b" / "refresh" / "state.json").write_text('{"v": 2}')
    (tmp_path / "b" / "manifest.parquet").unlink()
    (tmp_path / "b" / "split-shards.npz").write_bytes(b"s")
    assert b.push() == (2, 1)

    assert a.pull() == 2
    assert not (tmp_path / "a" / "manifest.parquet").exists()  # deleted on the other host
    assert (tmp_path / "a" / "refresh" / "state.json").read_text() == '{"v": 2}'
    assert (tmp_path / "a" / "split-shards.npz").read_bytes() == b"s"
    assert a.push() == (0, 0)


def test_a_task_pulls_only_what_it_reads_and_keeps_the_rest(s3_server: S3Server, tmp_path: Path) -> None:
    """gc reads the pack summary, not the gigabytes of manifest and plan; pushing what it wrote deletes nothing it
    did not pull; the next task that reads everything gets everything."""
    from imgest.operators.task_reads import task_reads

    url = f"s3://{s3_server.bucket}/tests/workarea-{secrets.token_hex(4)}"
    scan = WorkArea(tmp_path / "scan", "ds", url, s3_server.settings())
    (tmp_path / "scan").mkdir()
    for name in ("manifest.parquet", "shard_plan.parquet", "pack_shards.json", "scan_report.json"):
        (tmp_path / "scan" / name).write_text(name)
    assert scan.push() == (4, 0)
    gc = WorkArea(tmp_path / "gc", "ds", url, s3_server.settings())
    assert gc.pull(task_reads("ingest_imagenet", "gc")) == 1
    assert sorted(p.name for p in (tmp_path / "gc").iterdir() if not p.name.startswith(".")) == ["pack_shards.json"]
    (tmp_path / "gc" / "gc.json").write_text("{}")
    assert gc.push() == (1, 0)
    lock = WorkArea(tmp_path / "lock", "ds", url, s3_server.settings())
    assert lock.pull(task_reads("ingest_imagenet", "lock")) == 0
    assert task_reads("ingest_imagenet", "verify_cassandra") is None  # reads the manifest: the whole folder
    everything = WorkArea(tmp_path / "all", "ds", url, s3_server.settings())
    assert everything.pull(task_reads("refresh_x", "gc")) == 5


def test_a_sample_run_finds_the_sample_on_every_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ingest_imagenet's pre-execute hook on a host whose disk has never seen the run (a Celery worker, a pod):
    a run of the generated sample gets the same bytes the scan's host read, so the Spark job and verify find it."""
    from imgest.operators.workarea import work_hooks
    from imgest.sources.devdata.sample import DEMO_SAMPLE, ensure_sample

    class TaskInstance:
        task_id = "ingest_cassandra"

        def xcom_pull(self, task_ids: str) -> dict[str, object]:
            assert task_ids in ("validate", "scan")
            return {"dataset": "sampled", "sample": True} if task_ids == "validate" else {}  # scanned on a local disk

    monkeypatch.setenv("IMGEST_STATE_URL", "local")  # no store (else the hook needs one: no spark_default here)
    monkeypatch.setenv("IMGEST_HOME", str(tmp_path / "pod"))
    monkeypatch.setenv("IMGEST_LOCK_URL", "")  # restored after the test, whatever the hook exports
    # the run writes Cassandra: its lock lives in the keyspace, on the cluster of the task's connection (not reached)
    monkeypatch.setenv("AIRFLOW_CONN_CASSANDRA_DEFAULT", json.dumps({"conn_type": "cassandra", "host": "10.0.0.5"}))
    work_hooks()["pre_execute"]({"ti": TaskInstance()})
    assert os.environ["IMGEST_LOCK_URL"].startswith("cassandra://10.0.0.5:9042/imgest?")
    root = tmp_path / "pod" / "demo" / "sampled"
    here = {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    # what the scan's host read: the sample the scan step generates (the same spec, elsewhere)
    scanned = ensure_sample(tmp_path / "scan-host", DEMO_SAMPLE)
    there = {p.relative_to(scanned): p.read_bytes() for p in sorted(scanned.rglob("*")) if p.is_file()}
    assert len(here) > 50
    assert here == there


def test_a_record_names_a_report_by_its_copy_in_the_state_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A version record read on another host names the read-back report where every host finds it."""
    from imgest.core.workarea import shared_location

    monkeypatch.setenv("IMGEST_HOME", str(tmp_path))
    report = tmp_path / "work" / "ds" / "read_throughput.json"
    monkeypatch.setenv("IMGEST_STATE_URL", "s3://state/imgest/")
    assert shared_location(report) == "s3://state/imgest/work/ds/read_throughput.json"
    assert shared_location(tmp_path / "elsewhere.json") == str(tmp_path / "elsewhere.json")
    monkeypatch.setenv("IMGEST_STATE_URL", "local")
    assert shared_location(report) == str(report)
