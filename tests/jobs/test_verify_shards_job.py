"""Shard verification on Spark's executors (jobs/verify_shards.py, issue #66): real spark-submit against the real S3
server. A published version passes with every byte hashed across the tasks; a shard whose bytes changed and a missing
index fail the job, each named in its summary and its last line, as the in-process check names them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from imgest.services.s3 import S3Server
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.scan import scan_to_dir
from imgest.spark.shard_verify import balanced
from tests.jobs.conftest import read_summary, run_job

pytestmark = [pytest.mark.services, pytest.mark.slow]


def _env(s3: S3Server) -> dict[str, str]:
    key, secret = s3.credentials()
    return {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret, "IMGEST_S3_ENDPOINT": s3.endpoint}


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory, s3_server: S3Server) -> tuple[str, dict[str, Any]]:
    """A small version published to S3 by the pack job (shards of at most 10 samples): its location and manifest."""
    root = tmp_path_factory.mktemp("verify-job")
    write_sample(root / "src", SampleSpec("cls-loc", classes=6, per_class=12, val_per_class=3, seed=4))
    scan_to_dir(root / "src", root / "m")
    dest = f"s3://{s3_server.bucket}/tests/verify-job-{root.name}"
    args = ["--manifest-dir", str(root / "m"), "--dest", dest, "--max-count", "10", "--summary-json", str(root / "p")]
    rc, log = run_job("pack_shards", args, env=_env(s3_server))
    assert rc == 0, log[-3000:]
    client = s3_server.settings().client()
    prefix = dest.removeprefix(f"s3://{s3_server.bucket}/")
    doc = json.loads(client.get_object(Bucket=s3_server.bucket, Key=f"{prefix}/manifest.json")["Body"].read())
    return dest, doc


def _verify(s3: S3Server, dest: str, out: Path, *extra: str) -> tuple[int, str, dict[str, Any]]:
    rc, log = run_job("verify_shards", ["--dest", dest, "--summary-json", str(out), *extra], env=_env(s3))
    return rc, log, read_summary(out) if out.is_file() else {}


def test_every_shard_hashed_on_the_executors(
    published: tuple[str, dict[str, Any]], s3_server: S3Server, tmp_path: Path
) -> None:
    dest, doc = published
    rc, log, report = _verify(s3_server, dest, tmp_path / "v.json", "--tasks", "3")
    assert rc == 0, log[-3000:]
    shards = doc["shards"]
    assert len(shards) >= 9  # 90 train and val images in shards of at most 10: more shards than tasks
    assert (report["ok"], report["mismatches"]) == (True, [])
    assert report["shards"] == len(shards)
    assert report["hashed_bytes"] == report["bytes"] == sum(e["bytes"] for e in shards)  # every byte read back
    assert report["workers"] == 3 * 4  # three tasks, four shards at once in each
    assert "Spark tasks" in log.split("verifying ", 1)[1].split("\n", 1)[0]  # its log line says in how many


def test_a_changed_shard_and_a_missing_index_fail_the_job_by_name(
    published: tuple[str, dict[str, Any]], s3_server: S3Server, tmp_path: Path
) -> None:
    dest, doc = published
    client, bucket = s3_server.settings().client(), s3_server.bucket
    prefix = dest.removeprefix(f"s3://{bucket}/")
    first, second = doc["shards"][0], doc["shards"][1]
    tar_key, idx_key = f"{prefix}/{first['path']}", f"{prefix}/{second['index']}"
    body = client.get_object(Bucket=bucket, Key=tar_key)["Body"].read()
    index = client.get_object(Bucket=bucket, Key=idx_key)["Body"].read()
    try:
        client.put_object(Bucket=bucket, Key=tar_key, Body=body[:-1] + bytes([body[-1] ^ 1]))  # one bit, same size
        client.delete_object(Bucket=bucket, Key=idx_key)
        rc, log, report = _verify(s3_server, dest, tmp_path / "v.json")
    finally:
        client.put_object(Bucket=bucket, Key=tar_key, Body=body)
        client.put_object(Bucket=bucket, Key=idx_key, Body=index)
    assert rc != 0
    assert report["ok"] is False
    named = [f"{first['path']}: sha256 differs", f"{second['path']}: missing {second['index']}"]
    assert report["mismatches"] == sorted(named)
    assert "verifying failed: 2 problems in" in log


def test_the_cli_verifies_on_spark_with_a_master(published: tuple[str, dict[str, Any]], s3_server: S3Server) -> None:
    """`imgest verify shards DEST --master local[2]`: the job on Spark, not the command's own threads; its report."""
    import os
    import subprocess
    import sys

    dest, doc = published
    cmd = [str(Path(sys.executable).parent / "imgest"), "verify", "shards", dest, "--master", "local[2]"]
    done = subprocess.run(cmd, env=os.environ | _env(s3_server), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"shards: {len(doc['shards'])} checked on Spark (0 kept ones by size); log: " in done.stdout
    log = Path(done.stdout.split("; log: ", 1)[1].split("\n", 1)[0])
    assert "verifying " in log.read_text()  # the job's own log line: it ran
    report, _ = json.JSONDecoder().raw_decode(done.stdout[done.stdout.index("{") :])
    assert (report["ok"], report["hashed_bytes"]) == (True, sum(e["bytes"] for e in doc["shards"]))
    assert "verified: every shard of manifest.json is present with its sha256" in done.stdout


def test_tasks_get_about_equal_bytes() -> None:
    entries = [{"name": f"s{i}", "bytes": b} for i, b in enumerate([90, 10, 50, 50, 40, 30, 30])]
    groups = balanced(entries, 3)
    sizes = sorted(sum(e["bytes"] for e in g) for g in groups)
    assert sizes == [90, 100, 110]  # largest first, each to the lightest task: within 4/3 of the best split
    assert sorted(e["name"] for g in groups for e in g) == sorted(e["name"] for e in entries)  # each shard once
    assert len(balanced(entries[:2], 5)) == 2  # no empty task
