"""A refresh with deletion vectors, in a folder and on the real S3 server: a shard that lost a sample keeps its tar
(not one byte rewritten) with a new index of its live samples and its dead keys in manifest.json; a shard past the
compaction threshold is re-cut; only the changed and added samples are packed into new shards. Every reader of
shards then delivers exactly the live samples, each once, a changed one with its new bytes, and resumes at 40 %."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import shutil
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from PIL import Image

from imgest.core.quarantine import QuarantineLog
from imgest.readback.check_s3 import s3_keys
from imgest.readback.datasets import shards_set
from imgest.readback.readers import webdataset_batches
from imgest.readback.resumable import ShardResume, folder_fetch, s3_fetch, shard_dead, shard_units
from imgest.readback.s3shards import S3ShardStream, S3StreamOptions
from imgest.services.s3 import S3Server
from imgest.sinks.shards import pack as pack_module
from imgest.sinks.shards.gc import collect
from imgest.sinks.shards.pack import pack_planned
from imgest.sinks.shards.pack_ordered import Pending, settle_planned, source_rows, transform_in_order, write_in_order
from imgest.sinks.shards.pack_publish import (
    build_manifest,
    carry_published,
    marked_shards,
    plan_items,
    publish,
    samples_table,
)
from imgest.sinks.shards.pack_record import PackConfig
from imgest.sinks.shards.plan import PlanWriter, ShardSpec, plan_shards, read_shard_table
from imgest.sinks.shards.plan_digest import version_key
from imgest.sinks.shards.replan import replan
from imgest.sinks.shards.shard_table import DEAD_COUNT, TABLE_KEY, iter_details, shards_table
from imgest.sinks.shards.store import LocalStore, S3Store, ShardStore
from imgest.sinks.shards.store_names import manifest_objects
from imgest.sinks.shards.verify import verify_shards
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.manifest import manifest_metadata, read_classes
from imgest.sources.scan import scan_to_dir
from imgest.transform.image import TransformSpec
from tests.readback.test_resume import Ledger, _Batches, _stop_and_restore
from tests.shard_readers import read_dali

SHARDS = ShardSpec(max_count=10, seed=3)
SPEC = TransformSpec(mode="unchanged")  # stored bytes are the source bytes: the sha256 of the file on disk
PREFIX = "tests/shard-deletions"


TWIN: dict[str, ShardStore] = {}  # "store": a second store every _pack also packs into in the source's order


def _in_source_order(plan: Path, items: list[Any], cfg: PackConfig, store: ShardStore) -> list[Any]:
    """pack_in_source_order's passes in one process, Spark's two sorts as Python sorts."""
    settled = settle_planned(plan, items, cfg, lambda: store)
    pending = [s for s in settled if isinstance(s, Pending)]
    located = sorted(source_rows(plan, enumerate(pending)), key=lambda item: item[0])
    moved = sorted(transform_in_order(iter(located), cfg), key=lambda item: item[0])
    written = {r.name: r for r in write_in_order(iter(moved), pending, cfg, lambda: store)}
    return [written.get(s.name) if isinstance(s, Pending) else s for s in settled]


def _twin(work: Path, shards: list[tuple[str, int]], cfg: PackConfig, plan: pa.Table) -> list[Any]:
    """The records and manifest of PLAN packed in the source's order into TWIN's store, published there."""
    twin = TWIN["store"]
    live, cfg = twin.read_manifest(), dataclasses.replace(cfg, dest=twin.location)
    items = plan_items(shards, live, twin, marked_shards(work / "plan.parquet"))
    records = _in_source_order(work / "plan.parquet", items, cfg, twin)
    carry_published(records, live, twin)
    doc = build_manifest(records, cfg, read_classes(work / "classes.json"), QuarantineLog())
    publish(twin, doc, samples_table(plan, records), shards_table(records))
    return records


def _pack(work: Path, store: ShardStore, plan: pa.Table) -> dict[str, Any]:
    """What the pack job does with PLAN, in one process; returns the published manifest, with each shard's row of
    its shards table (``detail``: labels, quarantine, dead keys) and the shards read as rows (``read_as_rows``).
    With a TWIN store the same plan is also packed there in the source's order: its records must be the same."""
    manifest = work / "manifest.parquet"
    key = version_key(plan, SPEC)
    root = manifest_metadata(manifest)["root"]
    cfg = PackConfig(root, "del", store.location, SPEC, SHARDS, key=key)
    live = store.read_manifest()
    with PlanWriter(work / "plan.parquet", plan.schema, SPEC) as writer:
        writer.add_planned(plan)
    assert writer.result().key == key
    read: list[int] = []

    def table_read(source: Any, group: int, columns: list[str] | None = None) -> pa.Table:
        if columns is None:  # every column: a shard read to be packed (keep_published reads KEEP_COLUMNS)
            read.append(group)
        return read_shard_table(source, group, columns)

    with pytest.MonkeyPatch.context() as patch:  # which shards are read whole, as rows to pack (not kept)
        patch.setattr(pack_module, "read_shard_table", table_read)
        items = plan_items(writer.result().shards, live, store, marked_shards(work / "plan.parquet"))
        records = pack_planned(work / "plan.parquet", items, cfg, lambda: store)
    carry_published(records, live, store)
    if TWIN:
        assert [asdict(r) for r in _twin(work, writer.result().shards, cfg, plan)] == [asdict(r) for r in records]
    doc = build_manifest(records, cfg, read_classes(work / "classes.json"), QuarantineLog())
    publish(store, doc, samples_table(plan, records), shards_table(records))
    detail = {row["name"]: row for row in iter_details(store, doc)}
    return {**doc, "detail": detail, "read_as_rows": sorted(n for n, group in writer.result().shards if group in read)}


def _jpeg(color: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (48, 40), color).save(buf, "JPEG", quality=85)
    return buf.getvalue()


def _refreshed(root: Path, store: ShardStore) -> dict[str, Any]:
    """Version 1 of a 60-image dataset, then a refresh: shard 0 loses a changed sample, shard 1 a removed one,
    shard 2 three removed ones (past the threshold), two images added. Returns what the test checks."""
    src = root / "src"
    write_sample(src, SampleSpec("imagefolder", classes=3, per_class=20, val_per_class=0, seed=5))
    scan_to_dir(src, root / "m1")
    old_plan = plan_shards(root / "m1" / "manifest.parquet", SHARDS, SPEC)
    first = _pack(root / "m1", store, old_plan)
    rows = old_plan.to_pylist()
    in_shard = {n: [r for r in rows if r["shard"] == n] for n in sorted({r["shard"] for r in rows})}
    changed = in_shard["train-000000.tar"][3]
    removed = [in_shard["train-000001.tar"][5], *in_shard["train-000002.tar"][:3]]
    (src / changed["rel_path"]).write_bytes(_jpeg((200, 10, 10)))
    for row in removed:
        (src / row["rel_path"]).unlink()
    folder = (src / changed["rel_path"]).parent
    (folder / "added_1.JPEG").write_bytes(_jpeg((10, 200, 10)))
    (folder / "added_2.JPEG").write_bytes(_jpeg((10, 10, 200)))
    scan_to_dir(src, root / "m2")
    table = pq.read_table(root / "m2" / "manifest.parquet")
    touched = [changed["id"], *(r["id"] for r in removed)]
    result = replan(old_plan, table, touched, SHARDS, SPEC, refresh=2)
    second = _pack(root / "m2", store, result.plan)
    expected = {
        r["id"]: (r["label"], hashlib.sha256((src / r["rel_path"]).read_bytes()).hexdigest()) for r in table.to_pylist()
    }
    return {
        "root": root,
        "first": first,
        "second": second,
        "result": result,
        "changed": changed["id"],
        "removed": [r["id"] for r in removed],
        "expected": expected,
    }


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("deletions")
    store = LocalStore(root / "shards")
    yield {**_refreshed(root, store), "store": store, "location": str(root / "shards")}
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def on_s3(tmp_path_factory: pytest.TempPathFactory, s3_server: S3Server) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("s3deletions")
    store = S3Store(s3_server.settings(), s3_server.bucket, PREFIX)
    _clear(s3_server)
    yield {**_refreshed(root, store), "store": store, "s3": s3_server}
    _clear(s3_server)
    shutil.rmtree(root, ignore_errors=True)


def _clear(s3: S3Server) -> None:
    client = s3.settings().client()
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=PREFIX + "/")
    keys = [{"Key": o["Key"]} for page in pages for o in page.get("Contents", [])]
    for at in range(0, len(keys), 1000):
        client.delete_objects(Bucket=s3.bucket, Delete={"Objects": keys[at : at + 1000], "Quiet": True})


def test_refresh_keeps_touched_tars_and_packs_only_the_change(folder: dict[str, Any]) -> None:
    first, second, result = folder["first"], folder["second"], folder["result"]
    assert result.dropped == ["train-000002.tar"]  # 3 of 10 dead: past the threshold, re-cut
    assert result.marked == ["train-000000.tar", "train-000001.tar"]
    before = {e["name"]: e for e in first["shards"]}
    after = {e["name"]: e for e in second["shards"]}
    kept = [n for n in before if n != "train-000002.tar"]
    for name in kept:  # the same tar object, not one byte rewritten
        assert {k: after[name][k] for k in ("path", "bytes", "sha256", "digest")} == {
            k: before[name][k] for k in ("path", "bytes", "sha256", "digest")
        }
    dead = {name: row["dead"] for name, row in second["detail"].items()}  # from the version's shards.parquet
    assert dead["train-000000.tar"] == [folder["changed"]]
    assert dead["train-000001.tar"] == [folder["removed"][0]]
    assert after["train-000000.tar"][DEAD_COUNT] == after["train-000001.tar"][DEAD_COUNT] == 1
    assert not {"dead", "labels", "quarantine"} & {k for e in second["shards"] for k in e}  # not in manifest.json
    assert after["train-000000.tar"]["samples"] == after["train-000001.tar"]["samples"] == 9
    for name in ("train-000000.tar", "train-000001.tar"):  # the labels of the live samples in the tar
        lost = Counter(str(r["label"]) for r in result.plan.to_pylist() if r["shard"] == name and r["dead"])
        assert Counter(second["detail"][name]["labels"]) == Counter(first["detail"][name]["labels"]) - lost
    for name in kept[2:]:  # kept whole: the detail carried from version 1's table as it was
        assert DEAD_COUNT not in after[name]
        assert second["detail"][name] == first["detail"][name]
    assert after["train-000000.tar"]["index"] == f"v/{second['key']}/train-000000.idx"  # a new object, not the old
    new = sorted(set(after) - set(before))
    assert new == result.new
    # the job's way (pack_planned): the kept shards are decided from their columns, only new ones read as rows
    assert first["read_as_rows"] == sorted(before)
    assert second["read_as_rows"] == new
    # the new shards hold the changed sample, the two added ones and the 7 live samples of the re-cut shard
    assert sum(after[n]["samples"] for n in new) == 10
    assert second["samples"] == {"train": 58}
    assert sum(e["samples"] for e in second["shards"]) == 58
    store = folder["store"]
    report = verify_shards(store)
    assert report.ok, report.mismatches
    table = pq.read_table(io.BytesIO(store.read_bytes(second["samples_table"])))
    assert Counter(table.column("id").to_pylist()) == Counter(list(folder["expected"]))  # live ids, each once
    where = {r["id"]: r["shard"] for r in table.to_pylist()}
    assert where[folder["changed"]] in new
    # gc keeps the kept tars of version 1: the live manifest names them
    report_gc = collect(store, keep=0, min_age=0)
    assert report_gc.deleted == 13
    assert all(store.size(name) is not None for name in manifest_objects(second))
    assert verify_shards(store).ok


def test_verify_catches_an_index_that_lists_a_dead_sample(folder: dict[str, Any], tmp_path: Path) -> None:
    entry = next(e for e in folder["second"]["shards"] if e.get(DEAD_COUNT))
    store = folder["store"]
    good = store.read_bytes(entry["index"])
    assert good is not None
    copy = LocalStore(tmp_path)
    for name in manifest_objects(folder["second"]):
        body = store.read_bytes(name)
        assert body is not None
        copy.put_bytes(name, body)
    manifest = {k: v for k, v in folder["second"].items() if k not in ("detail", "read_as_rows")}
    copy.write_manifest(manifest)
    assert verify_shards(copy).ok
    lines = good.decode().splitlines()
    table = pq.read_table(io.BytesIO(copy.read_bytes(manifest[TABLE_KEY]) or b""))
    claimed = [
        [lines[1].split()[3].partition(".")[0]] if n == entry["name"] else d
        for n, d in zip(table.column("name").to_pylist(), table.column("dead").to_pylist(), strict=True)
    ]  # a live sample claimed dead in the shards table
    bad = table.set_column(table.column_names.index("dead"), "dead", pa.array(claimed, table.schema.field("dead").type))
    buf = io.BytesIO()
    pq.write_table(bad, buf)
    copy.put_bytes(manifest[TABLE_KEY], buf.getvalue())
    report = verify_shards(copy)
    assert [m for m in report.mismatches if "lists dead samples" in m], report.mismatches


def test_a_refresh_check_hashes_what_its_version_wrote(folder: dict[str, Any], tmp_path: Path) -> None:
    """hash_kept=False (a refresh's finish): the new version's shards are hashed, each kept one is checked for its
    size, sidecars and index; a kept tar of the wrong size is caught, one of its size but other bytes only by the
    full check (`imgest verify`)."""
    second = folder["second"]
    own = [e for e in second["shards"] if e["path"].startswith(f"v/{second['key']}/")]
    kept = [e for e in second["shards"] if e not in own]
    assert own
    assert kept
    report = verify_shards(folder["store"], hash_kept=False)
    assert report.ok, report.mismatches
    assert (report.hashed_bytes, report.kept_unhashed) == (sum(e["bytes"] for e in own), len(kept))
    copy = LocalStore(tmp_path)
    for name in manifest_objects(second):
        body = folder["store"].read_bytes(name)
        assert body is not None
        copy.put_bytes(name, body)
    copy.write_manifest(second)
    tar = kept[0]["path"]
    body = bytearray(copy.read_bytes(tar) or b"")
    body[600] ^= 0xFF  # inside the first member's bytes: same size, other bytes
    copy.put_bytes(tar, bytes(body))
    assert verify_shards(copy, hash_kept=False).ok
    assert verify_shards(copy).mismatches == [f"{tar}: sha256 differs"]
    copy.put_bytes(tar, bytes(body[:-512]))
    assert verify_shards(copy, hash_kept=False).mismatches == [
        f"{tar}: {len(body) - 512} bytes, manifest.json says {len(body)}"
    ]


def _check_samples(samples: list[tuple[Any, int, str, dict[str, Any]]], expected: dict[str, tuple[int, str]]) -> None:
    seen = Counter()
    for image, label, key, meta in samples:
        assert (label, hashlib.sha256(image.tobytes()).hexdigest()) == expected[key], key
        assert meta["sha256"] == expected[key][1]
        seen[key] += 1
    assert seen == Counter(list(expected))


def _resume(units: Any, fetch: Any, expected: dict[str, tuple[int, str]]) -> None:
    for world_after in (2, 3):
        ledger = Ledger(expected)
        _stop_and_restore(lambda state, rank: _Batches(ShardResume(units, fetch, state, rank, 4)), ledger, world_after)
        ledger.check_epoch()


def test_folder_readers_deliver_the_live_samples(folder: dict[str, Any]) -> None:
    manifest, expected = folder["second"], folder["expected"]
    units = shard_units(manifest)
    fetch = folder_fetch(folder["location"], shard_dead(manifest, folder["store"]))
    samples = [s for shard in fetch(list(zip(units.names, units.sizes.tolist(), strict=True))) for s in shard]
    _check_samples(samples, expected)
    _resume(units, fetch, expected)
    with pytest.raises(Exception, match="holds 10 samples, its manifest says 9"):  # a reader blind to dead keys
        list(ShardResume(units, folder_fetch(folder["location"]), _state(), 0).batches())


def _state() -> Any:
    from imgest.readback.resume import ReaderState

    return ReaderState(seed=1, world_size=1)


def test_dali_webdataset_reads_only_the_indexed_live_samples(folder: dict[str, Any]) -> None:
    rs = shards_set(folder["store"], split=None)
    base = Path(folder["location"])
    got = read_dali([base / s for s in rs.shards], ("jpg", "cls", "json"), [base / i for i in rs.indexes])
    expected = folder["expected"]
    seen = Counter()
    for image, cls, meta in got:
        key = json.loads(meta)["id"]
        assert (int(cls), hashlib.sha256(image).hexdigest()) == expected[key], key
        seen[key] += 1
    assert seen == Counter(list(expected))
    assert set(rs.id_list()) == set(expected)


def test_torch_dataset_delivers_the_live_samples_and_resumes(folder: dict[str, Any]) -> None:
    pytest.importorskip("torch", reason="imgest[torch] is part of the dev install (requirements/torch.txt)")
    from imgest.readback.torchdata import ShardDataset
    from tests.readback.test_torch_datasets import _epoch

    _epoch(lambda state, rank: ShardDataset(folder["location"], state, rank, split="train"), folder["expected"])


@pytest.mark.services
def test_s3_readers_deliver_the_live_samples(on_s3: dict[str, Any]) -> None:
    manifest, expected, s3 = on_s3["second"], on_s3["expected"], on_s3["s3"]
    assert on_s3["result"].marked == ["train-000000.tar", "train-000001.tar"]
    assert verify_shards(on_s3["store"]).ok
    units = shard_units(manifest)
    fetch = s3_fetch(s3.settings(), s3.bucket, PREFIX, dead=shard_dead(manifest, on_s3["store"]))
    samples = [s for shard in fetch(list(zip(units.names, units.sizes.tolist(), strict=True))) for s in shard]
    _check_samples(samples, expected)
    _resume(units, fetch, expected)
    rs = shards_set(on_s3["store"], split=None)
    dead = {f"{PREFIX}/{s}": keys for s, keys in rs.dead.items()}
    stream = S3ShardStream(s3.settings(), s3.bucket, s3_keys(rs, PREFIX), S3StreamOptions(batch_size=7), dead)
    streamed = [
        (image, label, key, meta)
        for images, labels, keys, metas in stream.epoch_batches()
        for image, label, key, meta in zip(images, labels.tolist(), keys, metas, strict=True)
    ]
    _check_samples(streamed, expected)
    client = s3.settings().client()
    urls = [f"s3://{s3.bucket}/{k}" for k in s3_keys(rs, PREFIX)]
    peer_dead = {f"s3://{s3.bucket}/{PREFIX}/{s}": keys for s, keys in rs.dead.items()}
    opener = lambda url: client.get_object(Bucket=s3.bucket, Key=url[len(f"s3://{s3.bucket}/") :])["Body"]  # noqa: E731
    peer = Counter(k for _, _, ids, _ in webdataset_batches(urls, 8, opener, peer_dead) for k in ids)
    assert peer == Counter(list(expected))
    pytest.importorskip("torch", reason="imgest[torch] is part of the dev install (requirements/torch.txt)")
    from imgest.readback.torchdata import ShardDataset
    from tests.readback.test_torch_datasets import _epoch

    location = f"s3://{s3.bucket}/{PREFIX}"
    _epoch(lambda state, rank: ShardDataset(location, state, rank, s3=s3.settings()), expected)


def test_a_changed_sample_is_dead_in_its_old_shard_and_live_in_a_new_one(folder: dict[str, Any]) -> None:
    plan = folder["result"].plan
    rows = plan.filter(pc.equal(plan.column("id"), folder["changed"])).to_pylist()
    assert len(rows) == 2
    shard_of = {r["dead"]: r["shard"] for r in rows}
    assert shard_of[True] == "train-000000.tar"
    assert shard_of[False] in folder["result"].new


def test_a_third_refresh_rewrites_only_the_index_of_a_shard_with_new_dead_samples(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "shards")
    done = _refreshed(tmp_path, store)
    root, plan = done["root"], done["result"].plan
    live = plan.filter(pc.and_(pc.equal(plan.column("shard"), "train-000001.tar"), pc.invert(plan.column("dead"))))
    gone = live.slice(0, 1).to_pylist()[0]
    (root / "src" / gone["rel_path"]).unlink()
    scan_to_dir(root / "src", root / "m3")
    third_plan = replan(plan, pq.read_table(root / "m3" / "manifest.parquet"), [gone["id"]], SHARDS, SPEC, refresh=3)
    assert (third_plan.dropped, third_plan.new, third_plan.marked) == ([], [], ["train-000000.tar", "train-000001.tar"])
    indexes = sorted(p.relative_to(store.root).as_posix() for p in store.root.rglob("*.idx"))
    third = _pack(root / "m3", store, third_plan.plan)
    before = {e["name"]: e for e in done["second"]["shards"]}
    after = {e["name"]: e for e in third["shards"]}
    assert after["train-000000.tar"] == before["train-000000.tar"]  # no new dead sample: the entry as it was
    assert third["detail"]["train-000000.tar"] == done["second"]["detail"]["train-000000.tar"]  # and its detail
    assert after["train-000001.tar"]["index"] == f"v/{third['key']}/train-000001.idx"
    before_dead = done["second"]["detail"]["train-000001.tar"]["dead"]
    assert third["detail"]["train-000001.tar"]["dead"] == sorted([*before_dead, gone["id"]])
    assert after["train-000001.tar"]["samples"] == 8
    new_indexes = sorted(p.relative_to(store.root).as_posix() for p in store.root.rglob("*.idx"))
    assert sorted(set(new_indexes) - set(indexes)) == [f"v/{third['key']}/train-000001.idx"]  # the only index written
    assert verify_shards(store).ok
    rs = shards_set(store, split=None)
    assert gone["id"] not in set(rs.id_list())
    assert len(rs) == 57


def test_the_source_order_packs_each_version_of_a_refresh_as_the_plan_order_does(tmp_path: Path) -> None:
    """Every version of the refresh (new shards, kept tars with dead samples, a re-cut shard) packed in the source's
    order (pack_ordered's passes) gives the records the plan's order gives: same tars, indexes, labels, dead keys."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(TWIN, "store", LocalStore(tmp_path / "twin"))
        done = _refreshed(tmp_path, LocalStore(tmp_path / "shards"))
    assert done["second"]["shards"]
    twin = {p.relative_to(tmp_path / "twin").as_posix(): p.read_bytes() for p in (tmp_path / "twin").rglob("*.tar")}
    ours = {p.relative_to(tmp_path / "shards").as_posix(): p.read_bytes() for p in (tmp_path / "shards").rglob("*.tar")}
    assert twin == ours
    assert len(ours) == 7  # every tar of both versions
