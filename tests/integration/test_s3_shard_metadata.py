"""On the real S3 server: a shard over 1,000 classes with many quarantined inputs keeps its object metadata
within AWS's 2 KB, and resumes from what it wrote with labels and quarantine intact (read from its sidecar)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imgest.core import workdir
from imgest.core.quarantine import QuarantineLog
from imgest.services.s3 import S3Server
from imgest.sinks.shards.pack import pack_shard
from imgest.sinks.shards.pack_publish import build_manifest, publish
from imgest.sinks.shards.pack_record import PackConfig
from imgest.sinks.shards.plan import ShardSpec
from imgest.sinks.shards.shard_table import iter_details, shards_table
from imgest.sinks.shards.store import S3_MAX_METADATA_BYTES, S3Store
from imgest.transform.image import TransformSpec
from tests.shard_fixtures import wide_shard_rows

pytestmark = pytest.mark.services


def test_wide_shard_metadata_fits_s3_limits(s3_server: S3Server, tmp_path: Path) -> None:
    rows = wide_shard_rows(tmp_path / "src", classes=1000, bad=500)
    prefix = "tests/wide-meta"
    store = S3Store(s3_server.settings(), s3_server.bucket, prefix)
    client = s3_server.settings().client()
    spec, shards = TransformSpec(), ShardSpec(max_count=5000)
    cfg = PackConfig(str(tmp_path / "src"), "wide", store.location, spec, shards, key="k1")
    record = pack_shard("train-000000.tar", rows, cfg, store)
    assert len(record.labels) == 1000
    assert len(record.quarantine) == 500

    for name in ("train-000000.tar", workdir.shard_index(record.name), workdir.shard_info(record.name)):
        head = client.head_object(Bucket=s3_server.bucket, Key=f"{prefix}/v/k1/{name}")
        size = sum(len(k) + len(v.encode()) for k, v in head["Metadata"].items())
        assert size <= S3_MAX_METADATA_BYTES, (name, size)
        assert set(head["Metadata"]) <= {"digest", "sha256", "bytes", "samples"}  # empty values may be dropped

    again = pack_shard("train-000000.tar", rows, cfg, store)
    assert again.reused == "resumed"
    assert (again.labels, again.quarantine) == (record.labels, record.quarantine)
    assert publish(store, build_manifest([again], cfg, [], QuarantineLog()), shards=shards_table([again]))
    doc = store.read_manifest()
    assert doc is not None
    assert "labels" not in doc["shards"][0]
    (detail,) = iter_details(store, doc)  # from shards.parquet on S3
    assert len(detail["labels"]) == 1000
    assert detail["quarantine"] == record.quarantine
    info = json.loads(b"".join(store.read_chunks(doc["shards"][0]["info"]) or []))
    assert len(info["quarantine"]) == 500
    for obj in client.list_objects_v2(Bucket=s3_server.bucket, Prefix=prefix).get("Contents", []):
        assert len(obj["Key"].encode()) <= 1024
        client.delete_object(Bucket=s3_server.bucket, Key=obj["Key"])
