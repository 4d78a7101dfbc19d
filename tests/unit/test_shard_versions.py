"""Versioned shard prefixes in a folder: publishing is one manifest write, older versions stay readable until the
switch, gc collects what no kept manifest names, verification hashes in parallel, old manifests still read."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from imgest.cli import main
from imgest.readback.datasets import shards_set
from imgest.sinks.shards.gc import GcError, collect
from imgest.sinks.shards.pack_publish import publish, samples_table
from imgest.sinks.shards.pack_record import PackConfig, ShardRecord
from imgest.sinks.shards.plan import ShardSpec, plan_shards
from imgest.sinks.shards.shard_table import shards_table
from imgest.sinks.shards.store import LocalStore
from imgest.sinks.shards.store_names import manifest_objects
from imgest.sinks.shards.verify import verify_shards
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.scan import scan_to_dir
from imgest.transform.image import TransformSpec
from tests.shard_fixtures import pack_in_process
from tests.shard_readers import read_dali

SHARDS = ShardSpec(max_count=8, seed=4)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("versions")
    write_sample(root / "src", SampleSpec("imagefolder", classes=3, per_class=8, val_per_class=2, seed=8))
    scan_to_dir(root / "src", root / "m")
    return root / "m"


def _files(root: Path) -> dict[str, int]:
    """Relative path -> inode number of every file under ROOT (an inode that stays is a file not rewritten)."""
    return {p.relative_to(root).as_posix(): p.stat().st_ino for p in root.rglob("*") if p.is_file()}


def _pack(
    manifest: Path, store: LocalStore, spec: TransformSpec, only: int | None = None, do_publish: bool = True
) -> tuple[PackConfig, list[ShardRecord], dict[str, Any]]:
    return pack_in_process(manifest, store, spec, SHARDS, only, do_publish)


def test_publish_is_one_manifest_write_and_the_old_version_stays_readable(manifest: Path, tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    cfg_a, _, doc_a = _pack(manifest, store, TransformSpec(quality=90))
    after_a = _files(tmp_path)
    outside = sorted(n for n in after_a if not n.startswith(f"v/{cfg_a.key}/"))
    # Only the manifest files are outside v/<key>/.
    assert outside == ["manifest.json", f"manifests/{cfg_a.key}.json"]
    assert doc_a["samples_table"] == f"v/{cfg_a.key}/samples.parquet"
    assert manifest_objects(doc_a) <= set(after_a)

    # A changed transform writes a new prefix; until the manifest write, the live dataset is the old one, whole.
    cfg_b, records_b, doc_b = _pack(manifest, store, TransformSpec(quality=70), do_publish=False)
    assert cfg_b.key != cfg_a.key
    assert all(r.path.startswith(f"v/{cfg_b.key}/") and not r.reused for r in records_b)
    assert store.read_manifest() == doc_a
    assert verify_shards(store).ok
    unchanged = {n: ino for n, ino in after_a.items() if n != "manifest.json"}
    before_switch = _files(tmp_path)
    table_b = plan_shards(manifest / "manifest.parquet", SHARDS, cfg_b.spec)
    assert publish(store, doc_b, samples_table(table_b, records_b), shards_table(records_b))
    after_b = _files(tmp_path)
    changed = {n for n in after_b if before_switch.get(n) != after_b[n]}
    assert changed == {"manifest.json", f"manifests/{cfg_b.key}.json", doc_b["samples_table"], doc_b["shards_table"]}
    assert all(after_b[n] == ino for n, ino in unchanged.items())  # nothing moved or copied
    live = store.read_manifest()
    assert live is not None
    assert live["key"] == cfg_b.key
    assert live["previous"] == cfg_a.key
    assert {e["name"] for e in live["shards"]} == {e["name"] for e in doc_a["shards"]}
    assert {e["sha256"] for e in live["shards"]}.isdisjoint({e["sha256"] for e in doc_a["shards"]})
    # Readers follow the entries: the read set names the new prefix and DALI reads it with its .idx files.
    rs = shards_set(store, split=None)
    assert sorted(rs.shards) == sorted(e["path"] for e in live["shards"])
    assert len(rs) == sum(live["samples"].values())
    tars = [tmp_path / s for s in rs.shards]
    assert len(read_dali(tars, ("jpg", "cls", "json"))) == len(rs)

    # The same plan again: same key, nothing written, nothing published.
    again_cfg, again, again_doc = _pack(manifest, store, TransformSpec(quality=70), do_publish=False)
    assert again_cfg.key == cfg_b.key
    assert {r.reused for r in again} == {"published"}
    assert not publish(store, again_doc, None)
    assert _files(tmp_path) == after_b


def test_interrupted_run_resumes_without_rewriting_finished_shards(manifest: Path, tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    cfg, first, _ = _pack(manifest, store, TransformSpec(), only=2, do_publish=False)  # killed after two shards
    assert store.read_manifest() is None
    finished = _files(tmp_path)
    _, records, doc = _pack(manifest, store, TransformSpec())
    assert [r.reused for r in records[:2]] == ["resumed", "resumed"]
    assert not any(r.reused for r in records[2:])
    now = _files(tmp_path)
    assert all(now[n] == ino for n, ino in finished.items())  # the finished shards' files were not rewritten
    assert [(r.path, r.sha256, r.labels) for r in records[:2]] == [(r.path, r.sha256, r.labels) for r in first]
    assert verify_shards(store).ok
    assert doc["key"] == cfg.key


def test_gc_keeps_current_and_keep_previous_and_dry_run_deletes_nothing(
    manifest: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = LocalStore(tmp_path)
    keys = [_pack(manifest, store, TransformSpec(quality=q))[0].key for q in (90, 80, 70)]
    (tmp_path / "_staging").mkdir()
    (tmp_path / "_staging" / "train-000000.tar").write_bytes(b"left by the old layout")
    (tmp_path / "v" / "abandoned").mkdir()
    (tmp_path / "v" / "abandoned" / "train-000000.tar").write_bytes(b"an interrupted run never published")
    everything = _files(tmp_path)

    young = collect(store, keep=1)  # default --min-age: everything here was written just now
    assert young.deleted == 0
    assert young.too_young > 0
    assert _files(tmp_path) == everything

    dry = collect(store, keep=1, dry_run=True, min_age=0)
    assert dry.dry_run
    assert dry.kept == [keys[2], keys[1]]
    assert dry.deleted == young.too_young
    assert set(dry.by_prefix) == {f"v/{keys[0]}", "v/abandoned", "_staging", "manifests"}
    assert _files(tmp_path) == everything  # a dry run deletes nothing

    done = collect(store, keep=1, min_age=0)
    assert done.deleted == dry.deleted > 0
    left = set(_files(tmp_path))
    assert not [n for n in left if n.startswith((f"v/{keys[0]}/", "v/abandoned/", "_staging/"))]
    assert f"manifests/{keys[0]}.json" not in left
    live = store.read_manifest()
    assert live is not None
    previous = json.loads((tmp_path / f"manifests/{keys[1]}.json").read_text())
    assert manifest_objects(live) | manifest_objects(previous) <= left
    assert not (tmp_path / "v" / keys[0]).exists()  # emptied folders go too
    assert verify_shards(store).ok

    assert collect(store, keep=1, min_age=0).deleted == 0  # nothing more to collect
    capsys.readouterr()
    assert main(["gc", "shards", str(tmp_path), "--keep", "0", "--min-age", "0"]) == 0  # the command line
    printed, line = capsys.readouterr().out.rsplit("\ngc: ", 1)
    last = json.loads(printed)
    assert set(last["by_prefix"]) == {f"v/{keys[1]}", "manifests"}
    assert last["by_prefix"]["manifests"] == 1
    assert line.startswith(f"deleted {last['deleted']} objects")
    assert verify_shards(store).ok
    rs = shards_set(store, split=None)
    assert len(rs) == sum(live["samples"].values())


def test_gc_refuses_without_a_manifest(tmp_path: Path) -> None:
    (tmp_path / "v" / "k").mkdir(parents=True)
    (tmp_path / "v" / "k" / "a.tar").write_bytes(b"x")
    with pytest.raises(GcError, match=r"no manifest\.json"):
        collect(LocalStore(tmp_path), min_age=0)
    with pytest.raises(GcError, match="--keep -1"):
        collect(LocalStore(tmp_path), keep=-1)
    assert (tmp_path / "v" / "k" / "a.tar").is_file()


def test_verify_hashes_every_shard_and_names_what_is_wrong(manifest: Path, tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    _, _, doc = _pack(manifest, store, TransformSpec())
    report = verify_shards(store, workers=3)
    assert report.ok
    assert report.hashed_bytes == doc["bytes"]
    assert report.shards == len(doc["shards"]) >= 4
    first, second, third = doc["shards"][:3]
    body = (tmp_path / first["path"]).read_bytes()
    (tmp_path / first["path"]).write_bytes(body[:-512])  # truncated
    flipped = bytearray((tmp_path / second["path"]).read_bytes())
    flipped[600] ^= 0xFF
    (tmp_path / second["path"]).write_bytes(bytes(flipped))  # same size, other bytes
    os.unlink(tmp_path / third["index"])
    bad = verify_shards(store, workers=2)
    assert not bad.ok
    assert bad.mismatches == sorted(
        [
            f"{first['path']}: {len(body) - 512} bytes, manifest.json says {first['bytes']}",
            f"{second['path']}: sha256 differs",
            f"{third['path']}: missing {third['index']}",
        ]
    )


def test_old_layout_manifests_still_read_and_their_shards_are_kept(manifest: Path, tmp_path: Path) -> None:
    """A dataset published before versioned prefixes (shards at the top, entries without 'path') still reads and
    verifies, and a new run with the same inputs keeps its shards where they are."""
    store = LocalStore(tmp_path)
    _, _, doc = _pack(manifest, store, TransformSpec())
    old = {k: v for k, v in doc.items() if k not in ("key", "samples_table", "previous")}
    for entry in old["shards"]:  # move every object to the top, as the old publish left them
        for field in ("path", "index", "info"):
            top = entry[field].rsplit("/", 1)[1]
            os.replace(tmp_path / entry[field], tmp_path / top)
            if (tmp_path / (entry[field] + ".meta.json")).is_file():
                os.unlink(tmp_path / (entry[field] + ".meta.json"))
            entry[field] = top
        del entry["path"]
    for entry in old["shards"]:
        assert (tmp_path / entry["name"]).is_file()
    os.replace(tmp_path / doc["samples_table"], tmp_path / "samples.parquet")  # old layout: at the top too
    (tmp_path / "manifest.json").write_text(json.dumps(old))
    assert verify_shards(store).ok
    rs = shards_set(store, split=None)
    assert sorted(rs.shards) == sorted(e["name"] for e in old["shards"])
    assert len(read_dali([tmp_path / s for s in rs.shards], ("jpg", "cls", "json"))) == len(rs)
    table = pq.read_table(tmp_path / "samples.parquet")
    assert table.num_rows == len(rs)

    _, records, new = _pack(manifest, store, TransformSpec())  # same inputs: the top-level shards are kept
    assert {r.reused for r in records} == {"published"}
    assert [e["path"] for e in new["shards"]] == [e["name"] for e in old["shards"]]
    assert verify_shards(store).ok
    for entry in new["shards"]:
        assert hashlib.sha256((tmp_path / entry["path"]).read_bytes()).hexdigest() == entry["sha256"]
