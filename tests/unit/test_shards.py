"""Shard planning, the tar writer and its DALI index, and packing into a local folder."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from imgest.core.errors import ConfigError
from imgest.core.quarantine import QuarantineLog
from imgest.sinks.shards.pack import pack_shard
from imgest.sinks.shards.pack_publish import build_manifest, publish
from imgest.sinks.shards.pack_record import PackConfig
from imgest.sinks.shards.plan import ShardSpec, plan_shards
from imgest.sinks.shards.plan_cut import sample_bound
from imgest.sinks.shards.plan_digest import version_key
from imgest.sinks.shards.store import LocalStore
from imgest.sinks.shards.tar_writer import ShardTarWriter, ustar_header
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.manifest import manifest_metadata, read_classes
from imgest.sources.read import read_candidate
from imgest.sources.scan import scan_to_dir
from imgest.transform.image import TransformSpec, transform_image
from tests.shard_readers import read_dali, read_webdataset


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shards")
    write_sample(root / "src", SampleSpec("imagefolder", classes=3, per_class=9, val_per_class=3, seed=3, defects=True))
    scan_to_dir(root / "src", root / "m")
    return root / "m"


def test_index_is_what_wds2idx_writes(tmp_path: Path) -> None:
    with ShardTarWriter(tmp_path / "a.tar") as writer:
        for i in range(9):
            writer.add(f"k{i:03d}", [("jpg", bytes([i]) * (700 + 333 * i)), ("cls", b"%d" % i), ("json", b"{}")])
    wds2idx = Path(sys.executable).with_name("wds2idx")
    subprocess.run([str(wds2idx), str(tmp_path / "a.tar"), str(tmp_path / "a.idx")], check=True, capture_output=True)
    assert writer.result is not None
    assert (tmp_path / "a.idx").read_text() == writer.result.index
    assert hashlib.sha256((tmp_path / "a.tar").read_bytes()).hexdigest() == writer.result.sha256


def test_same_samples_give_byte_identical_tars(tmp_path: Path) -> None:
    digests = []
    for name in ("a.tar", "b.tar"):
        with ShardTarWriter(tmp_path / name) as writer:
            writer.add("x1", [("jpg", b"abc"), ("cls", b"1")])
        digests.append((tmp_path / name).read_bytes())
    assert digests[0] == digests[1]


@pytest.mark.parametrize("key", ["a/b", "a.b", ""])
def test_keys_with_separators_are_refused(tmp_path: Path, key: str) -> None:
    with pytest.raises(ValueError, match="sample key"), ShardTarWriter(tmp_path / "x.tar") as writer:
        writer.add(key, [("jpg", b"x")])
    assert not (tmp_path / "x.tar").exists()


def test_plan_is_a_deterministic_partition_cut_by_count(manifest: Path) -> None:
    spec = TransformSpec()
    plan = plan_shards(manifest / "manifest.parquet", ShardSpec(max_count=7, seed=1), spec)
    again = plan_shards(manifest / "manifest.parquet", ShardSpec(max_count=7, seed=1), spec)
    other = plan_shards(manifest / "manifest.parquet", ShardSpec(max_count=7, seed=2), spec)
    assert plan.equals(again)
    assert plan.column("id").to_pylist() != other.column("id").to_pylist()
    rows = pq.read_table(manifest / "manifest.parquet")
    assert sorted(plan.column("id").to_pylist()) == sorted(rows.column("id").to_pylist())
    sizes = Counter(plan.column("shard").to_pylist())
    assert all(n <= 7 for n in sizes.values())
    per_split = Counter(rows.column("split").to_pylist())
    expected = [f"{split}-{i:06d}.tar" for split, n in sorted(per_split.items()) for i in range(-(-n // 7))]
    assert sorted(sizes) == expected
    for shard in sizes:  # every shard holds one split only
        assert (
            len(
                {
                    s
                    for s, n in zip(plan.column("split").to_pylist(), plan.column("shard").to_pylist(), strict=True)
                    if n == shard
                }
            )
            == 1
        )


def test_plan_respects_max_bytes_in_unchanged_mode(manifest: Path) -> None:
    spec = TransformSpec(mode="unchanged")
    limit = 600_000
    plan = plan_shards(manifest / "manifest.parquet", ShardSpec(max_count=1000, max_bytes=limit), spec).to_pylist()
    used: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for row in plan:
        used[row["shard"]] += sample_bound(row["size"], spec)
        count[row["shard"]] += 1
    for shard, total in used.items():
        assert total <= limit or count[shard] == 1  # a sample larger than the limit gets a shard of its own
    assert len(used) > 3


def test_bad_shard_settings() -> None:
    with pytest.raises(ConfigError):
        ShardSpec(max_count=0)
    with pytest.raises(ConfigError):
        ShardSpec(max_bytes=10)


def test_pack_publish_and_read_back_both_ways(manifest: Path, tmp_path: Path) -> None:
    spec = TransformSpec()
    shards = ShardSpec(max_count=10)
    table = plan_shards(manifest / "manifest.parquet", shards, spec)
    root = manifest_metadata(manifest / "manifest.parquet")["root"]
    cfg = PackConfig(root, "sample", str(tmp_path), spec, shards, key=version_key(table, spec))
    plan = table.to_pylist()
    store = LocalStore(tmp_path)
    records = []
    for shard in sorted({r["shard"] for r in plan}):
        rows = [r for r in plan if r["shard"] == shard]
        records.append(pack_shard(shard, rows, cfg, store))
    assert not (tmp_path / "manifest.json").exists()  # nothing visible before publish
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert all(name.startswith(f"v/{cfg.key}/") for name in written), written  # only the version prefix
    classes = read_classes(manifest / "classes.json")
    doc = build_manifest(records, cfg, classes, QuarantineLog.read(manifest / "quarantine.json"))
    assert publish(store, doc)
    published = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    # publish wrote the manifest and its kept copy, nothing else (no samples table given here), and moved nothing
    assert sorted(set(published) - set(written)) == ["manifest.json", f"manifests/{cfg.key}.json"]
    assert set(written) <= set(published)
    assert json.loads((tmp_path / "manifest.json").read_text())["quarantine"]["by_reason"] == {
        "corrupt": 2,
        "empty": 1,
        "not-an-image": 1,
        "too-large": 1,
    }
    tars = sorted((tmp_path / "v" / cfg.key).glob("*.tar"))
    for entry in doc["shards"]:
        assert entry["path"] == f"v/{cfg.key}/{entry['name']}"
        assert hashlib.sha256((tmp_path / entry["path"]).read_bytes()).hexdigest() == entry["sha256"]

    by_id = {r["id"]: r for r in plan}
    root = Path(cfg.root)
    samples = read_webdataset(tars)
    assert len(samples) == sum(doc["samples"].values())
    for key, members in samples.items():
        row = by_id[key]
        assert int(members["cls"]) == row["label"]
        assert json.loads(members["json"])["source"] == row["rel_path"]
        from imgest.sinks.shards.pack import CANDIDATE_FIELDS
        from imgest.sources.manifest import Candidate

        cand = Candidate(**{k: row[k] for k in CANDIDATE_FIELDS})
        assert members["jpg"] == transform_image(read_candidate(root, cand), spec).data
    dali = read_dali(tars, ("jpg", "cls", "json"))
    assert len(dali) == len(samples)
    for jpg, cls, meta in dali:
        key = json.loads(meta)["id"]
        assert jpg == samples[key]["jpg"]
        assert cls == samples[key]["cls"]


def test_unchanged_pack_records_the_digest_of_the_stored_bytes(manifest: Path, tmp_path: Path) -> None:
    spec = TransformSpec(mode="unchanged")
    table = plan_shards(manifest / "manifest.parquet", ShardSpec(max_count=50), spec)
    root = manifest_metadata(manifest / "manifest.parquet")["root"]
    cfg = PackConfig(root, "sample", str(tmp_path), spec, ShardSpec(max_count=50), key=version_key(table, spec))
    rows = table.to_pylist()
    plan = [r for r in rows if r["split"] == "train"]
    shard = plan[0]["shard"]
    record = pack_shard(shard, [r for r in plan if r["shard"] == shard], cfg, LocalStore(tmp_path))
    staged = sorted((tmp_path / "v").rglob("*.tar"))
    samples = read_webdataset(staged)
    assert len(samples) == record.samples > 0
    root = Path(cfg.root)
    by_id = {r["id"]: r for r in plan}
    for key, members in samples.items():
        meta = json.loads(members["json"])
        (image,) = (data for ext, data in members.items() if ext not in ("cls", "json"))  # jpg, png, ... as found
        assert meta["sha256"] == hashlib.sha256(image).hexdigest()
        assert image == (root / by_id[key]["rel_path"]).read_bytes()


@pytest.mark.parametrize("size", [0, 1, 511, 512, 10**6, 8**11 - 1])
@pytest.mark.parametrize("name", ["0f8e3c1e-2b8a-5d5e-9c1d-3f2a1b0c9d8e.jpg", "k.cls", "a" * 94 + ".json"])
def test_headers_are_what_tarfile_writes(name: str, size: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = size, 0, 0o644, 0, 0, "", ""
    assert ustar_header(name, size) == info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")
