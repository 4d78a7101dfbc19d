"""The refresh re-plan with deletion vectors: a scattered 0.1 % change keeps every old shard (its touched rows marked
dead) and cuts new shards only for the changed and added samples; a shard past the compaction threshold is re-cut;
the plan's live rows are the manifest's ids, each once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from imgest.core.errors import ConfigError
from imgest.sinks.shards.plan import DEAD, ShardSpec, plan_shards
from imgest.sinks.shards.plan_digest import version_key
from imgest.sinks.shards.replan import COMPACT_DEAD_FRACTION, replan, replan_file
from imgest.sources.diff_index import BaselineError
from imgest.sources.manifest import SCHEMA, image_id
from imgest.transform.image import TransformSpec

ROWS = 20_000
SHARDS = ShardSpec(max_count=200, seed=5)
SPEC = TransformSpec(mode="unchanged")


def _table(first: int, count: int) -> pa.Table:
    """COUNT synthetic manifest rows numbered from FIRST (train split, 10 classes)."""
    n = np.arange(first, first + count)
    rel = [f"train/n{i % 10:08d}/img_{i}.JPEG" for i in n.tolist()]
    return pa.table(
        {
            "id": pa.array([image_id("syn", "train", r) for r in rel], pa.string()),
            "split": pa.array(["train"] * count, pa.string()),
            "rel_path": pa.array(rel, pa.string()),
            "wnid": pa.array([f"n{i % 10:08d}" for i in n.tolist()], pa.string()),
            "label": pa.array(n % 10, pa.int32()),
            "size": pa.array(1000 + n % 997, pa.int64()),
            "mtime": pa.array(1_700_000_000.0 + n, pa.float64()),
            "container": pa.array([""] * count, pa.string()),
            "offset": pa.array(np.full(count, -1), pa.int64()),
            "etag": pa.array([""] * count, pa.string()),
        },
        schema=SCHEMA,
    )


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> tuple[pa.Table, pa.Table]:
    """(manifest, plan) of the first version."""
    path = tmp_path_factory.mktemp("replan") / "manifest.parquet"
    table = _table(0, ROWS)
    pq.write_table(table, path)
    return table, plan_shards(path, SHARDS, SPEC)


def _change(table: pa.Table, count: int, seed: int) -> tuple[pa.Table, list[str], list[str], list[str]]:
    """TABLE with COUNT scattered changes (a third changed, a third added, a third removed): (new, changed, added,
    removed ids)."""
    rng = np.random.default_rng(seed)
    picked = rng.choice(table.num_rows, size=2 * (count // 3), replace=False)
    changed = table.take(pa.array(picked[: count // 3])).column("id").to_pylist()
    removed = table.take(pa.array(picked[count // 3 :])).column("id").to_pylist()
    added_rows = _table(ROWS, count - 2 * (count // 3))
    keep = table.filter(pc.invert(pc.is_in(table.column("id"), value_set=pa.array(removed))))
    is_changed = pc.is_in(keep.column("id"), value_set=pa.array(changed))
    keep = keep.set_column(keep.column_names.index("mtime"), "mtime", pc.if_else(is_changed, 1.0, keep.column("mtime")))
    return pa.concat_tables([keep, added_rows]), changed, added_rows.column("id").to_pylist(), removed


def test_scattered_change_keeps_every_shard_and_packs_only_the_change(first: tuple[pa.Table, pa.Table]) -> None:
    table, old = first
    new, changed, added, removed = _change(table, ROWS // 1000, seed=1)
    result = replan(old, new, pa.array(changed + removed), SHARDS, SPEC, refresh=2)
    old_names = sorted(set(old.column("shard").to_pylist()))
    assert result.dropped == []
    assert result.kept == old_names  # no old shard dropped, none re-cut
    plan = result.plan
    dead = plan.filter(plan.column(DEAD))
    assert sorted(dead.column("id").to_pylist()) == sorted(changed + removed)
    assert result.dead == len(changed) + len(removed)
    touched_shards = set(
        old.filter(pc.is_in(old.column("id"), value_set=pa.array(changed + removed)))["shard"].to_pylist()
    )
    assert set(result.marked) == touched_shards
    fresh = plan.filter(pc.is_in(plan.column("shard"), value_set=pa.array(result.new)))
    assert sorted(fresh.column("id").to_pylist()) == sorted(changed + added)  # only the change is packed
    assert not pc.any(fresh.column(DEAD)).as_py()
    assert len(result.new) == 1
    # the kept shards' rows are the old plan's, in place: same digest, same tar
    kept = plan.filter(pc.invert(pc.is_in(plan.column("shard"), value_set=pa.array(result.new))))
    assert kept.drop_columns([DEAD]).equals(old.select(kept.drop_columns([DEAD]).column_names))
    live = plan.filter(pc.invert(plan.column(DEAD)))
    assert Counter(live.column("id").to_pylist()) == Counter(new.column("id").to_pylist())  # each live id once
    changed_live = live.filter(pc.is_in(live.column("id"), value_set=pa.array(changed)))
    assert set(changed_live.column("mtime").to_pylist()) == {1.0}  # the new version of a changed sample
    assert version_key(plan, SPEC) != version_key(plan.drop_columns([DEAD]), SPEC)  # dead rows are in the key


def test_a_second_refresh_carries_dead_rows_and_compacts_past_the_threshold(first: tuple[pa.Table, pa.Table]) -> None:
    table, old = first
    new, changed, _, removed = _change(table, ROWS // 1000, seed=2)
    once = replan(old, new, pa.array(changed + removed), SHARDS, SPEC, refresh=2)
    target = once.marked[0]
    rows = once.plan.filter(pc.equal(once.plan.column("shard"), target))
    live = rows.filter(pc.invert(rows.column(DEAD))).column("id").to_pylist()
    gone = live[: int(COMPACT_DEAD_FRACTION * rows.num_rows)]  # with the dead one already there: past the threshold
    later = new.filter(pc.invert(pc.is_in(new.column("id"), value_set=pa.array(gone))))
    twice = replan(once.plan, later, pa.array(gone), SHARDS, SPEC, refresh=3)
    assert twice.dropped == [target]
    assert target not in twice.kept
    assert set(twice.kept) == (set(once.kept) | set(once.new)) - {target}  # the last new shards are kept too
    assert twice.dead == once.dead - rows.filter(rows.column(DEAD)).num_rows  # the re-cut shard's dead rows are gone
    recut = twice.plan.filter(pc.is_in(twice.plan.column("shard"), value_set=pa.array(twice.new)))
    survivors = set(live) - set(gone)
    assert survivors <= set(recut.column("id").to_pylist())
    alive = twice.plan.filter(pc.invert(twice.plan.column(DEAD)))
    assert Counter(alive.column("id").to_pylist()) == Counter(later.column("id").to_pylist())
    for shard in twice.kept:  # no kept shard carries more dead rows than the threshold
        part = twice.plan.filter(pc.equal(twice.plan.column("shard"), shard))
        assert part.filter(part.column(DEAD)).num_rows <= COMPACT_DEAD_FRACTION * part.num_rows


def test_every_row_changed_recuts_every_shard(first: tuple[pa.Table, pa.Table]) -> None:
    table, old = first
    result = replan(old, table, table.column("id"), SHARDS, SPEC, refresh=2)  # a new transform: all changed
    assert result.kept == []
    assert result.dropped == sorted(set(old.column("shard").to_pylist()))
    assert result.plan.num_rows == ROWS
    assert not pc.any(result.plan.column(DEAD)).as_py()
    with pytest.raises(ConfigError, match="compaction threshold 1"):
        replan(old, table, [], SHARDS, SPEC, refresh=2, compact=1.0)


def test_plan_file_counts_live_rows(first: tuple[pa.Table, pa.Table], tmp_path: Path) -> None:
    from imgest.sinks.shards.plan import copy_plan

    table, old = first
    new, changed, _, removed = _change(table, ROWS // 1000, seed=3)
    result = replan(old, new, pa.array(changed + removed), SHARDS, SPEC, refresh=2)
    pq.write_table(result.plan, tmp_path / "refresh.parquet")
    copied = copy_plan(tmp_path / "refresh.parquet", tmp_path / "copy.parquet", SPEC)
    assert (copied.rows, copied.dead, copied.live) == (result.plan.num_rows, result.dead, new.num_rows)
    assert copied.key == version_key(result.plan, SPEC)


def test_a_plan_that_disagrees_with_the_manifest_is_refused(first: tuple[pa.Table, pa.Table], tmp_path: Path) -> None:
    """The rows written must be what the manifest holds beyond the kept shards' live rows: a mask that misses the
    added rows (a baseline and a plan out of step) is refused, naming what to delete, instead of dropping them."""
    table, old = first
    new, changed, _, removed = _change(table, 30, seed=4)
    missed = np.zeros(new.num_rows, bool)  # the added rows not marked as written
    with pytest.raises(BaselineError, match="delete the dataset's refresh folder"):
        replan_file(old, new, missed, pa.array(changed + removed), SHARDS, SPEC, 2, tmp_path / "plan.parquet")
    assert not (tmp_path / "plan.parquet").exists()


def test_touched_ids_are_one_set_per_replan_whatever_the_batch_size(
    first: tuple[pa.Table, pa.Table], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #41: the touched ids (and the re-cut shards' ids) are made a set once per re-plan, not once per batch
    of READ_ROWS, and the plan does not depend on where the batches end (one shard re-cut, the rest kept)."""
    from imgest.sinks.shards import replan as module

    table, old = first
    new, changed, _, removed = _change(table, ROWS // 100, seed=5)
    shard = old.filter(pc.equal(old.column("shard"), old.column("shard")[0]))
    extra = [i for i in shard.column("id").to_pylist() if i not in set(changed + removed)]
    extra = extra[: int(COMPACT_DEAD_FRACTION * shard.num_rows) + 1]  # past the threshold: that shard is re-cut
    new = new.filter(pc.invert(pc.is_in(new.column("id"), value_set=pa.array(extra))))
    touched = pa.array(changed + removed + extra)
    whole = replan(old, new, touched, SHARDS, SPEC, refresh=2)
    built: list[int] = []

    class Counted(module.IdSet):
        def __init__(self, ids: pa.Array | list[str]) -> None:
            super().__init__(ids)
            built.append(len(self))

    monkeypatch.setattr(module, "IdSet", Counted)
    monkeypatch.setattr(module, "READ_ROWS", 97)  # ROWS / 97: about 200 batches a pass
    small = replan(old, new, touched, SHARDS, SPEC, refresh=2)
    assert small.dropped == whole.dropped == [shard.column("shard")[0].as_py()]
    assert small.plan.equals(whole.plan)
    assert (small.kept, small.new, small.marked, small.dead) == (whole.kept, whole.new, whole.marked, whole.dead)
    live_recut = shard.num_rows - len(extra) - len(set(shard.column("id").to_pylist()) & set(changed + removed))
    assert sorted(built) == sorted([len(touched), 1, live_recut])  # touched, the re-cut shard's name, its live ids
