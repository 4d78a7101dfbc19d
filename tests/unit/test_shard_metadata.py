"""Shard object metadata stays within S3's 2 KB whatever the classes and quarantine; the rest is in sidecars."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imgest.core import workdir
from imgest.core.quarantine import QuarantineLog
from imgest.sinks.shards.pack import pack_shard
from imgest.sinks.shards.pack_publish import build_manifest, publish
from imgest.sinks.shards.pack_record import PackConfig
from imgest.sinks.shards.plan import ShardSpec
from imgest.sinks.shards.shard_table import iter_details, shards_table
from imgest.sinks.shards.store import S3_MAX_METADATA_BYTES, LocalStore, ObjectLimitError, check_key, check_metadata
from imgest.transform.image import TransformSpec
from tests.shard_fixtures import wide_shard_rows


def _meta_bytes(meta: dict[str, str]) -> int:
    return sum(len(k.encode()) + len(v.encode()) for k, v in meta.items())


def test_limits_are_enforced_before_a_request() -> None:
    with pytest.raises(ObjectLimitError, match="2048-byte limit"):
        check_metadata("b/k.tar", {"labels": "x" * 3000})
    with pytest.raises(ObjectLimitError, match="over S3's 1024"):
        check_key("p/" * 600)
    check_metadata("b/k.tar", {"a": "x" * 2000})


def test_thousand_classes_and_many_quarantined_files_keep_metadata_small(tmp_path: Path) -> None:
    rows = wide_shard_rows(tmp_path / "src", classes=1000, bad=400)
    out = tmp_path / "out"
    cfg = PackConfig(str(tmp_path / "src"), "wide", str(out), TransformSpec(), ShardSpec(max_count=5000), key="k1")
    store = LocalStore(tmp_path / "out")
    record = pack_shard("train-000000.tar", rows, cfg, store)
    assert record.samples == 1000
    assert len(record.labels) == 1000
    assert len(record.quarantine) == 400
    written = out / "v" / "k1"
    assert sorted(written.glob("*.meta.json"))
    for meta_file in written.glob("*.meta.json"):
        assert _meta_bytes(json.loads(meta_file.read_text())) < 256  # fixed-size fields only
    info = json.loads((written / workdir.shard_info("train-000000.tar")).read_text())
    assert info["labels"] == record.labels
    assert info["quarantine"] == record.quarantine

    again = pack_shard("train-000000.tar", rows, cfg, store)  # resumed: the sidecar restores the rest
    assert again.reused == "resumed"
    assert (again.labels, again.quarantine) == (record.labels, record.quarantine)

    doc = build_manifest([again], cfg, [], QuarantineLog())
    assert publish(store, doc, shards=shards_table([again]))
    live = json.loads((tmp_path / "out" / "manifest.json").read_text())
    entry = live["shards"][0]
    assert not {"labels", "quarantine", "dead"} & set(entry)  # the detail is in shards.parquet, not manifest.json
    assert entry["quarantined"] == 400
    (detail,) = iter_details(store, live)
    assert (detail["labels"], detail["quarantine"], detail["dead"]) == (record.labels, record.quarantine, [])
    assert (tmp_path / "out" / entry["info"]).is_file()
    assert S3_MAX_METADATA_BYTES == 2048
