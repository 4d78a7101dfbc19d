"""The shard plan of a refresh: published shards kept as they are, their removed and changed samples marked dead.

A refresh rewrites only what changed, as Delta Lake's deletion vectors do. A shard that holds a removed or changed
sample keeps its name, its rows and its published tar (no byte is rewritten); those samples' rows stay in the plan
with ``dead`` set, so the shard's input digest is still the tar's, and the pack job publishes the tar with a new
DALI index listing only its live samples and the dead keys in its manifest entry (``pack.kept_with_deletions``).
The changed and added samples are shuffled (seeded by the shard seed and the refresh number) and cut into new
shards, numbered after the highest index of their split. The cost of a refresh therefore follows the change, not
the number of shards it touches.

Compaction: a shard more than ``COMPACT_DEAD_FRACTION`` of whose rows are dead is re-cut instead: it is dropped
from the plan and its live samples join the new ones. A manifest entry therefore never lists more dead keys than
that fraction of its shard, and a new transform (every row changed) re-cuts every shard. The old objects are left
in place, so a reader of the old manifest.json keeps working until the new one is published.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from imgest.core.errors import ConfigError
from imgest.sinks.shards.plan import DEAD, ShardSpec, cut_shards, shard_index_of
from imgest.transform.image import TransformSpec

COMPACT_DEAD_FRACTION = 0.25  # a shard with more dead rows than this fraction of its rows is re-cut
PLAN_COLUMNS = ("shard", "pos", DEAD)  # the columns a plan adds to the manifest's


@dataclass(frozen=True)
class Replan:
    """The new plan and what happened to the old shards: KEPT (whole or with dead rows), DROPPED (re-cut), NEW;
    MARKED: the kept shards with dead rows, DEAD: the dead rows of the plan."""

    plan: pa.Table
    kept: list[str]
    dropped: list[str]
    new: list[str]
    marked: list[str]
    dead: int


def with_dead(plan: pa.Table) -> pa.Table:
    """PLAN with its ``dead`` column (a plan of a first version has none: every row is live)."""
    if DEAD in plan.column_names:
        return plan
    return plan.append_column(DEAD, pa.repeat(pa.scalar(False), plan.num_rows))


def replan(
    old_plan: pa.Table,
    manifest: pa.Table,
    touched: pa.Array | pa.ChunkedArray | list[str],
    shards: ShardSpec,
    spec: TransformSpec,
    refresh: int,
    compact: float = COMPACT_DEAD_FRACTION,
) -> Replan:
    """OLD_PLAN's shards, with the rows of TOUCHED (the ids removed or changed since OLD_PLAN) marked dead, plus new
    shards for the samples of MANIFEST that are not live in them; a shard with more than COMPACT of its rows dead is
    re-cut. TOUCHED is best an Arrow array: a removed source or a new transform touches every row, and nothing here
    holds a Python object per row."""
    if not 0 <= compact < 1:
        raise ConfigError(f"compaction threshold {compact} must be at least 0 and below 1 (a fraction of dead rows)")
    old_plan = with_dead(old_plan.replace_schema_metadata(None))
    columns = [c for c in old_plan.column_names if c not in PLAN_COLUMNS]
    manifest = manifest.replace_schema_metadata(None).select(columns)
    touched_ids = _array(touched)
    dead = pc.or_(old_plan.column(DEAD), pc.is_in(old_plan.column("id"), value_set=touched_ids))
    old_plan = old_plan.set_column(old_plan.column_names.index(DEAD), DEAD, dead)
    counts = (
        old_plan.select(["shard"])
        .append_column("n", pc.cast(dead, pa.int64()))
        .group_by("shard")
        .aggregate([("n", "sum"), ("n", "count")])
    )
    fraction = pc.divide(pc.cast(counts.column("n_sum"), pa.float64()), pc.cast(counts.column("n_count"), pa.float64()))
    dirty = sorted(counts.filter(pc.greater(fraction, compact)).column("shard").to_pylist())
    keep = old_plan.filter(pc.invert(pc.is_in(old_plan.column("shard"), value_set=pa.array(dirty, pa.string()))))
    live = keep.filter(pc.invert(keep.column(DEAD)))
    fresh = manifest.filter(pc.invert(pc.is_in(manifest.column("id"), value_set=live.column("id"))))
    highest: dict[str, int] = {}
    for pair in old_plan.select(["split", "shard"]).group_by(["split", "shard"]).aggregate([]).to_pylist():
        highest[pair["split"]] = max(highest.get(pair["split"], -1), shard_index_of(pair["shard"]))
    parts = [keep]
    for split in sorted(pc.unique(fresh.column("split")).to_pylist()):
        rows = fresh.filter(pc.equal(fresh.column("split"), split))
        seed = [shards.seed, zlib.crc32(split.encode()), refresh]
        cut = with_dead(cut_shards(rows, split, shards, spec, seed, highest.get(split, -1) + 1))
        parts.append(cut.cast(old_plan.schema))
    plan = pa.concat_tables(parts).sort_by([("shard", "ascending"), ("pos", "ascending")])
    kept = _names(keep)
    marked = _names(keep.filter(keep.column(DEAD)))
    dead_rows = pc.sum(pc.cast(keep.column(DEAD), pa.int64())).as_py() or 0
    return Replan(plan, kept, dirty, sorted(set(_names(plan)) - set(kept)), marked, dead_rows)


def _array(ids: pa.Array | pa.ChunkedArray | list[str]) -> pa.Array:
    """IDS as one Arrow string array."""
    if isinstance(ids, pa.ChunkedArray):
        return ids.combine_chunks() if ids.num_chunks else pa.array([], pa.string())
    return ids if isinstance(ids, pa.Array) else pa.array(ids, pa.string())


def _names(plan: pa.Table) -> list[str]:
    """The shard names of PLAN's rows, sorted, each once (no Python object per row)."""
    return sorted(pc.unique(plan.column("shard")).to_pylist())
