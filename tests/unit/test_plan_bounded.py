"""The out-of-core shard plan: bucketed seeded shuffle, streamed plan file, its version key and samples table."""

from __future__ import annotations

import io
import uuid
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from imgest.sinks.shards import plan as plan_module
from imgest.sinks.shards import plan_cut, plan_digest
from imgest.sinks.shards.pack_publish import samples_table
from imgest.sinks.shards.plan import (
    ShardSpec,
    build_plan,
    copy_plan,
    id_hashes,
    plan_shards,
    read_shard_table,
    shard_name,
    sidecar,
    take_plan,
    written_plan,
)
from imgest.sinks.shards.plan_cut import sample_bound
from imgest.sinks.shards.plan_digest import shard_digest, shard_table_digest, version_key
from imgest.transform.image import TransformSpec

CLASSES = 20
UNCHANGED = TransformSpec(mode="unchanged")


def _manifest(path: Path, train: int, val: int = 0, seed: int = 0) -> Path:
    """A manifest as a scan writes it: rows in class order (the order a shuffle must undo), varied sizes."""
    rng = np.random.default_rng(seed)
    rows = []
    for split, n in (("train", train), ("val", val)):
        for i in range(n):
            label = i * CLASSES // n
            rows.append(
                {
                    "id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{split}/{i}")),
                    "split": split,
                    "rel_path": f"{split}/c{label:03d}/{i}.JPEG",
                    "wnid": f"c{label:03d}",
                    "label": label,
                    "size": int(rng.integers(500, 90_000)),
                    "mtime": 1_700_000_000.5 + i,
                    "container": "",
                    "offset": -1,
                }
            )
    table = pa.Table.from_pylist(rows).replace_schema_metadata({"dataset": "synthetic", "layout": "cls-loc"})
    pq.write_table(table, path, row_group_size=97)  # several row groups, as a scan writes them
    return path


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _manifest(tmp_path_factory.mktemp("plan") / "manifest.parquet", train=2000, val=300)


def _global_shuffle(manifest: Path, split: str, seed: int) -> list[str]:
    """The plan order before buckets: the split's ids sorted, then permuted with [seed, crc32(split)]."""
    table = pq.read_table(manifest)
    ids = sorted(table.filter(pc.equal(table.column("split"), split)).column("id").to_pylist())
    return [ids[i] for i in np.random.default_rng([seed, zlib.crc32(split.encode())]).permutation(len(ids))]


def test_a_split_within_one_bucket_keeps_the_global_shuffle(manifest: Path) -> None:
    shards = ShardSpec(max_count=64, seed=5)
    plan = plan_shards(manifest, shards, UNCHANGED)  # default bucket size: both splits fit one bucket
    for split in ("train", "val"):
        rows = plan.filter(pc.equal(plan.column("split"), split))
        assert rows.column("id").to_pylist() == _global_shuffle(manifest, split, 5)
    assert plan.schema.metadata[b"dataset"] == b"synthetic"  # the manifest's metadata travels with the plan
    assert plan_shards(manifest, shards, UNCHANGED, bucket_rows=300).column("id").to_pylist() != (
        plan.column("id").to_pylist()
    )  # buckets give another (equally seeded) order


@pytest.mark.parametrize("bucket_rows", [5, 37, 250])
def test_bucketed_plan_is_deterministic_and_holds_every_row_once(
    manifest: Path, tmp_path: Path, bucket_rows: int
) -> None:
    shards = ShardSpec(max_count=50, seed=1)
    a = build_plan(manifest, tmp_path / "a.parquet", shards, UNCHANGED, bucket_rows)
    b = build_plan(manifest, tmp_path / "b.parquet", shards, UNCHANGED, bucket_rows)
    other = build_plan(manifest, tmp_path / "c.parquet", ShardSpec(max_count=50, seed=2), UNCHANGED, bucket_rows)
    plan = pq.read_table(a.path)
    assert plan.equals(pq.read_table(b.path))
    assert a.key == b.key
    assert a.shards == b.shards
    assert other.key != a.key
    assert plan.column("id").to_pylist() != pq.read_table(other.path).column("id").to_pylist()
    source = pq.read_table(manifest)
    assert Counter(plan.column("id").to_pylist()) == Counter(source.column("id").to_pylist())  # each once
    assert a.rows == source.num_rows
    assert a.key == version_key(plan, UNCHANGED)  # the key build_plan streams is the key of the whole plan
    assert not list(tmp_path.glob(".plan-spill-*"))
    assert not list(tmp_path.glob("*.partial"))


def test_bucketed_shards_mix_classes(manifest: Path) -> None:
    plan = plan_shards(manifest, ShardSpec(max_count=100, seed=3), UNCHANGED, bucket_rows=250)  # 8 train buckets
    train = plan.filter(pc.equal(plan.column("split"), "train"))
    per_shard: dict[str, Counter[int]] = {}
    for shard, label in zip(train.column("shard").to_pylist(), train.column("label").to_pylist(), strict=True):
        per_shard.setdefault(shard, Counter())[label] += 1
    assert len(per_shard) == 20
    for shard, labels in per_shard.items():  # 100 draws of 20 equal classes: about 17 distinct, none dominant
        assert len(labels) >= 12, (shard, labels)
        assert max(labels.values()) <= 20, (shard, labels)


def test_each_bucket_is_shuffled_alone_with_bounded_rows(manifest: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real = plan_module.shuffled_order

    def spy(rows: pa.Table, seed: list[int]) -> pa.Array:
        seen.append(rows.num_rows)
        return real(rows, seed)

    monkeypatch.setattr(plan_module, "shuffled_order", spy)
    monkeypatch.setattr(plan_module, "SPILL_BATCH_ROWS", 128)  # the spill groups rows a few batches at a time
    plan_shards(manifest, ShardSpec(max_count=50), UNCHANGED, bucket_rows=100)
    assert len(seen) == 20 + 3  # train: ceil(2000 / 100) buckets, val: ceil(300 / 100)
    assert sum(seen) == 2300
    assert max(seen) <= 2 * 100  # a bucket holds about bucket_rows rows, never the whole split


def test_greedy_cut_runs_on_across_buckets(manifest: Path) -> None:
    shards = ShardSpec(max_count=40, max_bytes=1 << 20, seed=4)
    plan = plan_shards(manifest, shards, UNCHANGED, bucket_rows=64)
    for split in ("train", "val"):
        rows = plan.filter(pc.equal(plan.column("split"), split)).to_pylist()
        names = list(dict.fromkeys(r["shard"] for r in rows))
        assert names == [shard_name(split, i) for i in range(len(names))]
        groups = [[r for r in rows if r["shard"] == name] for name in names]
        for group, after in zip(groups, [*groups[1:], None], strict=True):
            assert [r["pos"] for r in group] == list(range(len(group)))
            used = sum(sample_bound(r["size"], UNCHANGED) for r in group)
            assert len(group) <= 40
            assert used <= shards.max_bytes or len(group) == 1
            if after is not None:  # a shard closes only when the next sample would not fit
                assert len(group) == 40 or used + sample_bound(after[0]["size"], UNCHANGED) > shards.max_bytes


def test_equal_bounds_cut_arithmetically_like_the_loop(manifest: Path) -> None:
    jpeg = TransformSpec()  # JPEG mode: every sample has the same bound
    shards = ShardSpec(max_count=1000, max_bytes=40 * sample_bound(0, jpeg) + 5, seed=2)
    plan = plan_shards(manifest, shards, jpeg, bucket_rows=64)  # buckets of ~64 rows, shards of 40 straddle them
    train = plan.filter(pc.equal(plan.column("split"), "train"))
    assert Counter(train.column("shard").to_pylist()) == {shard_name("train", i): 40 for i in range(50)}
    need = np.full(130, sample_bound(0, jpeg))
    whole = plan_cut._greedy_cut(need, shards, (0, 0, 0))
    state, pieces = (0, 0, 0), []
    for part in (need[:7], need[7:7], need[7:100], need[100:]):
        shard, pos, state = plan_cut._greedy_cut(part, shards, state)
        pieces.append((shard, pos))
    assert np.array_equal(whole[0], np.concatenate([p[0] for p in pieces]))
    assert np.array_equal(whole[1], np.concatenate([p[1] for p in pieces]))
    assert whole[2] == state


def test_plan_file_has_a_row_group_per_shard_and_copies_keep_the_key(manifest: Path, tmp_path: Path) -> None:
    built = build_plan(manifest, tmp_path / "plan.parquet", ShardSpec(max_count=70, seed=1), UNCHANGED, 300)
    meta = pq.ParquetFile(built.path).metadata
    assert meta.num_row_groups == len(built.shards)
    for name, group in built.shards:
        assert set(pq.ParquetFile(built.path).read_row_group(group).column("shard").to_pylist()) == {name}
    table = pq.read_table(built.path)
    pq.write_table(table, tmp_path / "refresh.parquet", row_group_size=33)  # a refresh writes any row groups
    copied = copy_plan(tmp_path / "refresh.parquet", tmp_path / "copy.parquet", UNCHANGED)
    assert (copied.key, copied.shards, copied.rows) == (built.key, built.shards, built.rows)
    assert pq.read_table(copied.path).equals(table)


def test_a_written_plan_is_taken_as_is_and_any_other_is_rewritten(
    manifest: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pack job takes a refresh's plan byte for byte when its sidecar (written by PlanWriter) matches the file
    and the transform: the same shards, rows and key as a rewrite, without reading the plan; a plan without one, a
    sidecar of another file or another transform falls back to the rewrite."""
    built = build_plan(manifest, tmp_path / "plan.parquet", ShardSpec(max_count=70, seed=1), UNCHANGED, 300)
    assert sidecar(built.path).is_file()
    rewritten = copy_plan(built.path, tmp_path / "rewritten.parquet", UNCHANGED)
    calls: list[Path] = []
    monkeypatch.setattr(plan_module, "copy_plan", lambda plan, out, spec: calls.append(plan) or rewritten)
    taken = take_plan(built.path, tmp_path / "job" / "plan.parquet", UNCHANGED)
    assert calls == []
    assert (taken.key, taken.shards, taken.rows, taken.dead) == (rewritten.key, rewritten.shards, rewritten.rows, 0)
    assert taken.path.read_bytes() == built.path.read_bytes()
    assert written_plan(taken.path, UNCHANGED) == taken
    other = TransformSpec("jpeg", 64, 56, 90)
    assert written_plan(built.path, other) is None
    take_plan(built.path, tmp_path / "other.parquet", other)
    pq.write_table(pq.read_table(built.path), tmp_path / "bare.parquet", row_group_size=33)
    take_plan(tmp_path / "bare.parquet", tmp_path / "bare-copy.parquet", UNCHANGED)
    (tmp_path / "plan.parquet").write_bytes((tmp_path / "bare.parquet").read_bytes())  # the sidecar is stale now
    assert written_plan(built.path, UNCHANGED) is None
    assert calls == [built.path, tmp_path / "bare.parquet"]


def test_a_shards_digest_from_its_columns_is_the_digest_of_its_rows(manifest: Path, tmp_path: Path) -> None:
    """The pack job decides whether a shard is kept from its plan rows' columns (shard_table_digest): the digest must
    be the one pack_shard records from the rows as dicts, for float mtimes and every label."""
    built = build_plan(manifest, tmp_path / "plan.parquet", ShardSpec(max_count=70, seed=1), UNCHANGED, 300)
    spec = TransformSpec("jpeg", 64, 56, 90)
    for _, group in built.shards:
        table = read_shard_table(built.path, group, ["id", "size", "mtime", "label", "absent"])
        assert table.column_names == ["id", "size", "mtime", "label"]
        rows = read_shard_table(built.path, group).to_pylist()
        assert shard_table_digest(table, spec) == shard_digest(rows, spec)
        assert shard_table_digest(table, spec) != shard_digest(rows, UNCHANGED)
    # mtimes Arrow prints as repr does, a whole one ("1795694298.0"), and ones it would not (its own loop then)
    for mtime in (0.0, -0.0, 1.0, 1e-4, 0.1, 1795694298.0, 1795694298.3954206, 9999999999.5, 1e10, 1.5e15 + 0.25):
        for extra in (2.5e-7, float("nan"), 1.5):
            table = pa.table({"id": ["a", "b"], "size": [1, 2], "mtime": [mtime, extra], "label": [3, 40]})
            for part in (table, table.slice(1), pa.concat_tables([table, table.slice(1)])):
                assert shard_table_digest(part, spec) == shard_digest(part.to_pylist(), spec), (mtime, extra)


def test_the_version_key_by_arrow_kernels_is_the_rows_loops(
    manifest: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan's version key is hashed from text that Arrow's kernels write (_lines): the same key as the loop
    over the rows as Python values, with dead rows, whole and fractional mtimes."""
    built = pq.read_table(build_plan(manifest, tmp_path / "plan.parquet", ShardSpec(max_count=70), UNCHANGED, 300).path)
    mtimes = [1795694298.0, 0.5, 1795694298.3954206, 0.0]
    tables = [
        built,
        built.append_column("dead", pa.array([i % 3 == 0 for i in range(built.num_rows)])),
        built.set_column(
            built.schema.get_field_index("mtime"), "mtime", pa.array([mtimes[i % 4] for i in range(built.num_rows)])
        ),
    ]
    fast = [version_key(table, UNCHANGED) for table in tables]
    assert len(set(fast)) == 3
    monkeypatch.setattr(plan_digest, "_lines", lambda rows, columns: None)
    assert [version_key(table, UNCHANGED) for table in tables] == fast


def test_empty_manifest_plans_nothing(tmp_path: Path) -> None:
    schema = pq.read_schema(_manifest(tmp_path / "one.parquet", train=1))
    pq.write_table(schema.empty_table(), tmp_path / "empty.parquet")
    built = build_plan(tmp_path / "empty.parquet", tmp_path / "plan.parquet", ShardSpec(), UNCHANGED)
    assert (built.rows, built.shards) == (0, [])
    assert pq.read_table(built.path).schema.names[-2:] == ["shard", "pos"]


def test_id_hashes_are_seeded_and_stable() -> None:
    ids = pa.array(["a", "", "0123456789abcdef-long-id", "a"])
    h = id_hashes(ids, 0)
    assert h.dtype == np.uint64
    assert h[0] == h[3]
    assert len(set(h[:3].tolist())) == 3
    assert np.array_equal(h, id_hashes(pa.chunked_array([ids.slice(0, 2), ids.slice(2)]), 0))
    assert not np.array_equal(h, id_hashes(ids, 1))
    assert int(id_hashes(pa.array(["a"]), 0)[0]) == int(h[0])  # no dependence on the batch around an id
    for seed in (0, 1, 2**40 + 3):  # plans depend on these numbers: pinned to a plain-Python FNV-1a + splitmix64
        assert id_hashes(ids, seed).tolist() == [_reference_hash(i, seed) for i in ids.to_pylist()]


def _reference_hash(text: str, seed: int) -> int:
    mask = 2**64 - 1

    def mix(z: int) -> int:
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    h = 0xCBF29CE484222325 ^ mix(seed & mask)
    for byte in text.encode():
        h = ((h ^ byte) * 0x100000001B3) & mask
    return mix(h)


def test_samples_table_streams_a_plan_file_with_positions_across_groups(manifest: Path, tmp_path: Path) -> None:
    built = build_plan(manifest, tmp_path / "plan.parquet", ShardSpec(max_count=70, seed=1), UNCHANGED, 300)
    plan = pq.read_table(built.path)
    pq.write_table(plan, tmp_path / "odd.parquet", row_group_size=33)  # shards straddle row groups
    ids, shards = plan.column("id").to_pylist(), plan.column("shard").to_pylist()

    class Quarantined:  # a shard's record with one quarantined sample
        def __init__(self, row: int) -> None:
            self.name, self.quarantine, self.dead = shards[row], [{"id": ids[row]}], []

    records = [Quarantined(0), Quarantined(71), Quarantined(len(ids) - 1)]
    for source in (built.path, tmp_path / "odd.parquet", plan):
        table = pq.read_table(io.BytesIO(samples_table(source, records)))  # type: ignore[arg-type]
        assert table.num_rows == plan.num_rows - 3
        assert table.column_names == ["id", "label", "split", "shard", "position"]
        rows = table.to_pylist()
        for name in {r["shard"] for r in rows}:
            assert [r["position"] for r in rows if r["shard"] == name] == list(
                range(sum(r["shard"] == name for r in rows))
            )
        assert [r["id"] for r in rows] == [i for i in ids if i not in {ids[0], ids[71], ids[-1]}]
