"""manifest.json stays small whatever the classes: each shard's labels, quarantine and dead keys live in the version's
shards.parquet, read a group of shards at a time; a manifest written before the table still reads; and the pack
job's Spark tasks get the shards they pack with only what keeping them needs, never the whole live manifest."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

from imgest.core.errors import ImgestError
from imgest.core.quarantine import QuarantineLog
from imgest.jobs.pack_shards import shard_task
from imgest.sinks.shards import shard_table
from imgest.sinks.shards.pack_publish import build_manifest, carry_published, plan_items, publish, published_entries
from imgest.sinks.shards.pack_record import PUBLISHED_FIELDS, PackConfig, ShardRecord
from imgest.sinks.shards.plan import ShardSpec
from imgest.sinks.shards.shard_table import DEAD_COUNT, TABLE_KEY, dead_keys, iter_details, shards_table
from imgest.sinks.shards.store import LocalStore
from imgest.sinks.shards.store_names import manifest_objects
from imgest.sources.manifest import ClassInfo
from imgest.transform.image import TransformSpec

KEY = "k" * 16


def _records(shards: int, classes: int, dead_every: int = 3) -> list[ShardRecord]:
    """SHARDS records, each with a label count for every one of CLASSES classes, one quarantined input, and dead keys
    in every DEAD_EVERY-th shard."""
    records = []
    for i in range(shards):
        name = f"train-{i:06d}.tar"
        bad = [{"path": f"train/x/{i}.JPEG", "split": "train", "reason": "corrupt", "detail": "d", "id": f"q{i}"}]
        records.append(
            ShardRecord(
                name, "train", 50, 1000 + i, f"{i:064x}", f"{i + 7:064x}", f"v/{KEY}/{name}",
                f"v/{KEY}/train-{i:06d}.idx", f"v/{KEY}/train-{i:06d}.info.json",
                labels={str(c): 1 + (c + i) % 5 for c in range(classes)}, quarantine=bad,
                dead=[f"d{i}-{j}" for j in range(2)] if i % dead_every == 0 else [],
            )
        )  # fmt: skip
    return records


def _published(tmp_path: Path, records: list[ShardRecord], classes: int) -> tuple[LocalStore, dict[str, Any]]:
    cfg = PackConfig("/src", "t", str(tmp_path), TransformSpec(), ShardSpec(50), key=KEY)
    store = LocalStore(tmp_path)
    doc = build_manifest(records, cfg, [ClassInfo(c, f"n{c:08d}") for c in range(classes)], QuarantineLog())
    assert publish(store, doc, b"", shards_table(records))
    live = store.read_manifest()
    assert live is not None
    return store, live


def test_manifest_keeps_counts_and_the_table_keeps_the_detail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shard_table, "GROUP_SHARDS", 4)  # several row groups
    records = _records(10, classes=300)
    store, live = _published(tmp_path, records, 300)
    assert live[TABLE_KEY] == f"v/{KEY}/shards.parquet"
    assert live[TABLE_KEY] in manifest_objects(live)  # gc keeps it, verify checks it
    for entry, record in zip(live["shards"], records, strict=True):
        assert not {"labels", "quarantine", "dead"} & set(entry)
        assert entry["quarantined"] == len(record.quarantine)
        assert entry.get(DEAD_COUNT, 0) == len(record.dead)
    rows = list(iter_details(store, live))
    assert [(r["name"], r["labels"], r["quarantine"], r["dead"]) for r in rows] == [
        (r.name, r.labels, r.quarantine, r.dead) for r in records
    ]
    assert dead_keys(store, live) == {r.name: frozenset(r.dead) for r in records if r.dead}
    only = {records[5].name, records[6].name}
    assert [r["name"] for r in iter_details(store, live, ["dead"], only)] == sorted(only)
    # the manifest's size follows the shards, not shards x classes: 300 classes more cost no byte per shard
    wider = _records(10, classes=600)
    _, live_wider = _published(tmp_path / "wider", wider, 300)
    assert json.dumps(live_wider["shards"]) == json.dumps(live["shards"])


def test_a_manifest_written_before_the_table_still_reads(tmp_path: Path) -> None:
    records = _records(4, classes=5)
    store = LocalStore(tmp_path)
    old = {
        "key": KEY,
        "shards": [
            {"name": r.name, "path": r.path, "index": r.index, "info": r.info, "digest": r.digest, "sha256": r.sha256}
            | {"samples": r.samples, "bytes": r.bytes, "split": r.split, "labels": r.labels, "quarantine": r.quarantine}
            | ({"dead": r.dead} if r.dead else {})
            for r in records
        ],
    }
    store.write_manifest(old)
    assert [(d["name"], d["labels"], d["quarantine"], d["dead"]) for d in iter_details(store, old)] == [
        (r.name, r.labels, r.quarantine, r.dead) for r in records
    ]
    assert dead_keys(store, old) == {r.name: frozenset(r.dead) for r in records if r.dead}
    entries = published_entries(old)
    assert all(set(e) <= set(PUBLISHED_FIELDS) for e in entries.values())
    assert entries[records[0].name][DEAD_COUNT] == len(records[0].dead)
    carried = [
        ShardRecord(r.name, r.split, r.samples, r.bytes, r.sha256, r.digest, r.path, r.index, r.info, carried=True)
        for r in records
    ]
    carry_published(carried, old, store)
    assert [(c.labels, c.quarantine, c.dead, c.carried) for c in carried] == [
        (r.labels, r.quarantine, r.dead, False) for r in records
    ]


def test_tasks_get_their_shards_entries_not_the_live_manifest(tmp_path: Path) -> None:
    small_store, _ = _published(tmp_path / "small", _records(3, classes=20), 20)
    big_store, big = _published(tmp_path / "big", _records(300, classes=1000), 1000)
    cfg = PackConfig("/src", "t", str(tmp_path), TransformSpec(), ShardSpec(50), key="n" * 16)
    task = shard_task(tmp_path / "plan.parquet", cfg)
    assert len(cloudpickle.dumps(task)) < 4096  # no entry inside: the same function for 3 shards or 300
    shards = [(e["name"], g) for g, e in enumerate(big["shards"])]
    marked = {"train-000003.tar"}  # a shard a refresh marks dead rows in: it alone travels with its detail
    items = plan_items(shards, big, big_store, marked)
    assert [(n, g) for n, g, _ in items] == shards
    plain = [live for name, _, live in items if name not in marked]
    assert all(live is not None and set(live) <= set(PUBLISHED_FIELDS) for live in plain)
    (detailed,) = [live for name, _, live in items if name in marked]
    expected = next(r for r in iter_details(big_store, big, names=marked))
    assert {k: detailed[k] for k in ("labels", "quarantine", "dead")} == {
        k: expected[k] for k in expected if k != "name"
    }
    one = len(pickle.dumps(items[1]))
    assert one < 1024  # an unmarked shard's entry: a few fixed-size fields, whatever the classes
    assert len(pickle.dumps(items)) < one * len(items) + len(pickle.dumps(detailed)) + 1024
    assert plan_items(shards[:3], None, small_store, set()) == [(n, g, None) for n, g in shards[:3]]


def test_carrying_a_shard_the_live_table_lacks_is_refused(tmp_path: Path) -> None:
    store, live = _published(tmp_path, _records(2, classes=3), 3)
    ghost = ShardRecord("train-000009.tar", "train", 1, 1, "", "", "p", "i", "f", "published", carried=True)
    with pytest.raises(ImgestError, match=r"train-000009\.tar"):
        carry_published([ghost], live, store)
    (tmp_path / live[TABLE_KEY]).unlink()
    with pytest.raises(shard_table.ShardTableError, match=r"shards\.parquet is missing"):
        list(iter_details(store, live))
