"""The shard plan of a refresh: untouched shards kept as they are, the rest re-cut into new shards.

A shard that holds no removed or changed sample keeps its name and rows, so its input digest is unchanged and
the pack job keeps the published object (nothing is rewritten). Shards that held a removed or changed sample
are dropped from the new manifest; their remaining samples, the changed ones and the added ones are shuffled
(seeded by the shard seed and the refresh number) and cut into shards with new names, numbered after the
highest index of their split. The old objects are left in place, so a reader of the old manifest.json keeps
working until the new one is published.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from imgest.sinks.shards.plan import ShardSpec, cut_shards, shard_index_of
from imgest.transform.image import TransformSpec


@dataclass(frozen=True)
class Replan:
    """The new plan and what happened to the old shards."""

    plan: pa.Table
    kept: list[str]
    dropped: list[str]
    new: list[str]


def replan(
    old_plan: pa.Table,
    manifest: pa.Table,
    touched: pa.Array | pa.ChunkedArray | list[str],
    shards: ShardSpec,
    spec: TransformSpec,
    refresh: int,
) -> Replan:
    """OLD_PLAN's untouched shards plus new shards for the samples of MANIFEST that are not in them. TOUCHED:
    the ids removed or changed since OLD_PLAN (their shards are dropped), best as an Arrow array: a removed source
    or a new transform touches every row, and nothing here holds a Python object per row."""
    old_plan = old_plan.replace_schema_metadata(None)
    manifest = manifest.replace_schema_metadata(None).select(old_plan.schema.names[:-2])
    if isinstance(touched, pa.ChunkedArray):
        touched = touched.combine_chunks() if touched.num_chunks else pa.array([], pa.string())
    touched_ids = touched if isinstance(touched, pa.Array) else pa.array(touched, pa.string())
    dirty = _names(old_plan.filter(pc.is_in(old_plan.column("id"), value_set=touched_ids)))
    keep = old_plan.filter(pc.invert(pc.is_in(old_plan.column("shard"), value_set=pa.array(dirty, pa.string()))))
    fresh = manifest.filter(pc.invert(pc.is_in(manifest.column("id"), value_set=keep.column("id"))))
    highest: dict[str, int] = {}
    for pair in old_plan.select(["split", "shard"]).group_by(["split", "shard"]).aggregate([]).to_pylist():
        highest[pair["split"]] = max(highest.get(pair["split"], -1), shard_index_of(pair["shard"]))
    parts = [keep]
    for split in sorted(pc.unique(fresh.column("split")).to_pylist()):
        rows = fresh.filter(pc.equal(fresh.column("split"), split))
        seed = [shards.seed, zlib.crc32(split.encode()), refresh]
        parts.append(cut_shards(rows, split, shards, spec, seed, highest.get(split, -1) + 1).cast(old_plan.schema))
    plan = pa.concat_tables(parts).sort_by([("shard", "ascending"), ("pos", "ascending")])
    kept = _names(keep)
    return Replan(plan, kept, dirty, sorted(set(_names(plan)) - set(kept)))


def _names(plan: pa.Table) -> list[str]:
    """The shard names of PLAN's rows, sorted, each once (no Python object per row)."""
    return sorted(pc.unique(plan.column("shard")).to_pylist())
