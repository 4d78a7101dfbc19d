"""The shard job end to end: real spark-submit against the real local S3 server (SeaweedFS)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from imgest.cli import main
from imgest.services.s3 import S3Server
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.manifest import Candidate, iter_manifest, manifest_metadata
from imgest.sources.read import read_candidate
from imgest.sources.scan import scan_to_dir
from imgest.spark.submit import submit_command, submit_env
from imgest.splits.split import load_split
from imgest.transform.image import TransformSpec, transform_image
from tests.jobs.conftest import MASTER, kill_when, read_summary, run_job
from tests.shard_readers import read_dali, read_webdataset

pytestmark = [pytest.mark.services, pytest.mark.slow]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pack")
    write_sample(root / "src", SampleSpec("cls-loc", classes=4, per_class=15, val_per_class=4, seed=21, defects=True))
    scan_to_dir(root / "src", root / "m")
    return root / "m"


def _env(s3: S3Server, secret: str | None = None) -> dict[str, str]:
    key, real_secret = s3.credentials()
    return {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret or real_secret, "IMGEST_S3_ENDPOINT": s3.endpoint}


def _keys(client: Any, bucket: str, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
    return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))


def _download(client: Any, bucket: str, prefix: str, dest: Path) -> dict[str, Any]:
    dest.mkdir(parents=True, exist_ok=True)
    doc = json.loads(client.get_object(Bucket=bucket, Key=f"{prefix}/manifest.json")["Body"].read())
    for entry in doc["shards"]:
        for name in (entry["name"], entry["index"]):
            client.download_file(bucket, f"{prefix}/{name}", str(dest / name))
    return doc


def _pack(manifest: Path, s3: S3Server, prefix: str, out: Path, *extra: str) -> dict[str, Any]:
    args = [
        "--manifest-dir",
        str(manifest),
        "--dest",
        f"s3://{s3.bucket}/{prefix}",
        "--max-count",
        "12",
        "--seed",
        "5",
        "--summary-json",
        str(out),
        *extra,
    ]
    rc, log = run_job("pack_shards", args, env=_env(s3))
    assert rc == 0, log[-3000:]
    return read_summary(out)


def test_publish_read_back_both_ways_and_rerun_identically(
    manifest: Path, s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, bucket = s3_server.settings().client(), s3_server.bucket
    for prefix in ("tests/pack-a", "tests/pack-b"):
        for key in _keys(client, bucket, prefix):
            client.delete_object(Bucket=bucket, Key=key)
    first = _pack(manifest, s3_server, "tests/pack-a", tmp_path / "a.json")
    assert first["published"] is True
    keys = _keys(client, bucket, "tests/pack-a")
    assert not [k for k in keys if "/_staging/" in k]
    doc = _download(client, bucket, "tests/pack-a", tmp_path / "a")
    assert sorted(k.rsplit("/", 1)[1] for k in keys) == sorted(
        [
            "manifest.json",
            "samples.parquet",
            *(e["name"] for e in doc["shards"]),
            *(e["index"] for e in doc["shards"]),
            *(e["info"] for e in doc["shards"]),  # the sidecar with labels and quarantine (not S3 metadata)
        ]
    )
    for entry in doc["shards"]:
        assert hashlib.sha256((tmp_path / "a" / entry["name"]).read_bytes()).hexdigest() == entry["sha256"]
        assert entry["samples"] <= 12
    assert doc["quarantine"]["by_reason"] == {
        "corrupt": 2,
        "empty": 1,
        "no-label": 1,
        "not-an-image": 1,
        "too-large": 1,
    }

    rows = {c.id: c for c in iter_manifest(manifest / "manifest.parquet")}
    root = Path(manifest_metadata(manifest / "manifest.parquet")["root"])
    tars = sorted((tmp_path / "a").glob("*.tar"))
    samples = read_webdataset(tars)
    assert len(samples) == len(rows) - 5  # every row but the five unreadable files
    for key, members in samples.items():
        cand: Candidate = rows[key]
        assert int(members["cls"]) == cand.label
        assert members["jpg"] == transform_image(read_candidate(root, cand), TransformSpec()).data
    dali = read_dali(tars, ("jpg", "cls", "json"))
    assert sorted((json.loads(m)["id"], c, j) for j, c, m in dali) == sorted(
        (k, m["cls"], m["jpg"]) for k, m in samples.items()
    )

    split_path = tmp_path / "split.npz"
    for key, value in _env(s3_server).items():  # the CLI reads S3 keys from the environment
        monkeypatch.setenv(key, value)
    assert main(["split", "--shards", f"s3://{bucket}/tests/pack-a", "-r", "3,1", "-o", str(split_path)]) == 0
    split = load_split(split_path)
    assert sorted(split.row_ids.tolist()) == sorted(samples)
    assert sorted(np.concatenate(split.parts).tolist()) == list(range(len(samples)))

    second = _pack(manifest, s3_server, "tests/pack-b", tmp_path / "b.json")
    doc_b = _download(client, bucket, "tests/pack-b", tmp_path / "b")
    assert [e["sha256"] for e in doc_b["shards"]] == [e["sha256"] for e in doc["shards"]]
    assert second["shards"] == first["shards"]
    again = _pack(manifest, s3_server, "tests/pack-a", tmp_path / "a2.json")
    assert again["shards_kept_published"] == first["shards"]
    assert again["published"] is False


def test_resume_after_interrupted_upload_with_nothing_visible(
    manifest: Path, s3_server: S3Server, tmp_path: Path
) -> None:
    client, bucket, prefix = s3_server.settings().client(), s3_server.bucket, "tests/pack-resume"
    for key in _keys(client, bucket, prefix):
        client.delete_object(Bucket=bucket, Key=key)
    args = [
        "--manifest-dir",
        str(manifest),
        "--dest",
        f"s3://{bucket}/{prefix}",
        "--max-count",
        "4",
        "--seed",
        "5",
        "--partitions",
        "20",
    ]
    proc = subprocess.Popen(
        submit_command("pack_shards", args, "local[1]"),
        env={**submit_env(MASTER), **_env(s3_server)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    staged = kill_when(
        proc, lambda: [k for k in _keys(client, bucket, prefix) if k.endswith(".tar")], lambda tars: len(tars) >= 2
    )
    keys = _keys(client, bucket, prefix)
    assert len(staged) >= 2, "the kill did not land mid-way"
    assert all("/_staging/" in k for k in keys), keys  # nothing published: no manifest, no live shard
    assert f"{prefix}/manifest.json" not in keys

    out = tmp_path / "resumed.json"
    rc, log = run_job("pack_shards", [*args, "--summary-json", str(out)], env=_env(s3_server))
    assert rc == 0, log[-3000:]
    resumed = read_summary(out)
    assert resumed["shards_reused_staged"] >= 2
    assert not [k for k in _keys(client, bucket, prefix) if "/_staging/" in k]
    doc = _download(client, bucket, prefix, tmp_path / "r")
    assert sum(doc["samples"].values()) == sum(1 for _ in iter_manifest(manifest / "manifest.parquet")) - 5
    for entry in doc["shards"]:
        assert hashlib.sha256((tmp_path / "r" / entry["name"]).read_bytes()).hexdigest() == entry["sha256"]


def test_wrong_credentials_give_a_clear_error(manifest: Path, s3_server: S3Server, tmp_path: Path) -> None:
    secret = "not-the-secret-zz9"
    args = ["--manifest-dir", str(manifest), "--dest", f"s3://{s3_server.bucket}/tests/pack-denied"]
    rc, log = run_job("pack_shards", args, env=_env(s3_server, secret=secret))
    assert rc != 0
    assert "refused the credentials" in log
    assert s3_server.endpoint in log
    assert secret not in log
