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
    """The live manifest; each shard and .idx it names downloaded to DEST/<its base name>."""
    dest.mkdir(parents=True, exist_ok=True)
    doc = json.loads(client.get_object(Bucket=bucket, Key=f"{prefix}/manifest.json")["Body"].read())
    for entry in doc["shards"]:
        for name in (entry["path"], entry["index"]):
            client.download_file(bucket, f"{prefix}/{name}", str(dest / name.rsplit("/", 1)[1]))
    return doc


def _modified(client: Any, bucket: str, prefix: str) -> dict[str, tuple[Any, str]]:
    """Key -> (LastModified, ETag) of every object under PREFIX (a rewritten object changes both or one)."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
    return {obj["Key"]: (obj["LastModified"], obj["ETag"]) for page in pages for obj in page.get("Contents", [])}


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
    assert _keys(client, bucket, "tests/pack-a") == []
    first = _pack(manifest, s3_server, "tests/pack-a", tmp_path / "a.json")
    assert first["published"] is True
    keys = _keys(client, bucket, "tests/pack-a")
    doc = _download(client, bucket, "tests/pack-a", tmp_path / "a")
    version = f"v/{first['key']}"
    assert doc["key"] == first["key"]
    assert doc["previous"] is None
    # Everything the job wrote is under v/<key>/ but the manifest files: no staging area, no copy.
    assert sorted(k.removeprefix("tests/pack-a/") for k in keys) == sorted(
        [
            "manifest.json",
            f"manifests/{first['key']}.json",
            f"{version}/samples.parquet",
            f"{version}/shards.parquet",  # each shard's labels, quarantine and dead keys
            *(e["path"] for e in doc["shards"]),
            *(e["index"] for e in doc["shards"]),
            *(e["info"] for e in doc["shards"]),  # the sidecar with labels and quarantine (not S3 metadata)
        ]
    )
    for entry in doc["shards"]:
        assert entry["path"] == f"{version}/{entry['name']}"
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
    assert second["key"] == first["key"]  # the key derives from the plan and transform, not from the destination
    before = _modified(client, bucket, "tests/pack-a")
    again = _pack(manifest, s3_server, "tests/pack-a", tmp_path / "a2.json")
    assert again["shards_kept_published"] == first["shards"]
    assert again["published"] is False
    assert _modified(client, bucket, "tests/pack-a") == before  # a repeated run writes nothing


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
    written = kill_when(
        proc, lambda: [k for k in _keys(client, bucket, prefix) if k.endswith(".tar")], lambda tars: len(tars) >= 2
    )
    keys = _keys(client, bucket, prefix)
    assert len(written) >= 2, "the kill did not land mid-way"
    assert all(k.startswith(f"{prefix}/v/") for k in keys), keys  # nothing published: no manifest, no samples
    finished = {k: v for k, v in _modified(client, bucket, prefix).items() if k.endswith(".tar")}

    out = tmp_path / "resumed.json"
    rc, log = run_job("pack_shards", [*args, "--summary-json", str(out)], env=_env(s3_server))
    assert rc == 0, log[-3000:]
    resumed = read_summary(out)
    assert resumed["shards_resumed"] >= len(finished) >= 2
    after = _modified(client, bucket, prefix)
    assert {k: after[k] for k in finished} == finished  # the finished shards were not uploaded again
    assert all(k.startswith(f"{prefix}/v/{resumed['key']}/") for k in finished)
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


def test_changed_transform_switches_prefix_at_the_manifest_write_and_gc_collects_the_old(
    manifest: Path, s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, bucket, prefix = s3_server.settings().client(), s3_server.bucket, "tests/pack-switch"
    dest = f"s3://{bucket}/{prefix}"
    for key in _keys(client, bucket, prefix):
        client.delete_object(Bucket=bucket, Key=key)
    for key, value in _env(s3_server).items():  # the CLI reads S3 keys from the environment
        monkeypatch.setenv(key, value)
    old = _pack(manifest, s3_server, prefix, tmp_path / "old.json")
    old_objects = _modified(client, bucket, prefix)
    assert _download(client, bucket, prefix, tmp_path / "old")["key"] == old["key"]

    # A run with another transform, killed mid-way: it wrote under a new prefix; the old version is live and whole.
    args = ["--manifest-dir", str(manifest), "--dest", dest, "--max-count", "12", "--seed", "5", "--quality", "70"]
    proc = subprocess.Popen(  # the plan _pack below makes too (same count, seed, transform): the same key
        submit_command("pack_shards", [*args, "--partitions", "20"], "local[1]"),
        env={**submit_env(MASTER), **_env(s3_server)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    new_tars = kill_when(
        proc,
        lambda: [k for k in _keys(client, bucket, prefix) if k.endswith(".tar") and f"/v/{old['key']}/" not in k],
        lambda tars: len(tars) >= 1,
    )
    assert new_tars, "the kill did not land mid-way"
    now = _modified(client, bucket, prefix)
    assert {k: now[k] for k in old_objects} == old_objects  # nothing of the live version was touched
    assert all("/v/" in k and f"/v/{old['key']}/" not in k for k in set(now) - set(old_objects))
    assert main(["verify", "shards", dest]) == 0  # the old manifest's shards are all readable, sha256-equal

    left = [k for k in _keys(client, bucket, prefix) if k.endswith(".tar") and f"/v/{old['key']}/" not in k]
    new = _pack(manifest, s3_server, prefix, tmp_path / "new.json", "--quality", "70")
    assert new["key"] != old["key"]
    assert new["previous"] == old["key"]
    assert new["shards_resumed"] == len(left)  # every tar the killed run finished, and only those
    after = _modified(client, bucket, prefix)
    assert all(k in after for k in old_objects)  # publishing deleted nothing
    written = set(after) - set(old_objects)
    top = {f"{prefix}/manifest.json", f"{prefix}/manifests/{new['key']}.json"}
    assert {k for k in written if not k.startswith(f"{prefix}/v/{new['key']}/")} <= top
    new_doc = _download(client, bucket, prefix, tmp_path / "new")
    assert {e["path"].split("/")[1] for e in new_doc["shards"]} == {new["key"]}
    assert main(["verify", "shards", dest]) == 0

    # gc: a dry run deletes nothing; --keep 1 keeps the old version; --keep 0 collects it, never the live one.
    listed = _keys(client, bucket, prefix)
    assert main(["gc", "shards", dest, "--keep", "0", "--min-age", "0", "--dry-run"]) == 0
    assert _keys(client, bucket, prefix) == listed
    assert main(["gc", "shards", dest, "--min-age", "0"]) == 0
    assert all(k in _keys(client, bucket, prefix) for k in old_objects)
    assert main(["gc", "shards", dest, "--keep", "0", "--min-age", "0"]) == 0
    remaining = _keys(client, bucket, prefix)
    assert not [k for k in remaining if f"/v/{old['key']}/" in k or k.endswith(f"manifests/{old['key']}.json")]
    needed = {f"{prefix}/{e[f]}" for e in new_doc["shards"] for f in ("path", "index", "info")}
    assert needed <= set(remaining)
    assert f"{prefix}/{new_doc['samples_table']}" in remaining
    assert main(["verify", "shards", dest]) == 0
