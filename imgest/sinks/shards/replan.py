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

import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from imgest.core.errors import ConfigError
from imgest.core.idset import IdSet
from imgest.sinks.shards.plan import DEAD, PlanFile, PlanWriter, ShardSpec
from imgest.sinks.shards.plan_cut import cut_shards, shard_index_of
from imgest.sources.diff_index import BaselineError
from imgest.transform.image import TransformSpec

COMPACT_DEAD_FRACTION = 0.25  # a shard with more dead rows than this fraction of its rows is re-cut
PLAN_COLUMNS = ("shard", "pos", DEAD)  # the columns a plan adds to the manifest's
READ_ROWS = 16_384  # rows of the old plan or the manifest decoded at a time

Rows = pa.Table | Path  # a plan or manifest: a table (tests, small datasets) or its Parquet file (streamed)


@dataclass(frozen=True)
class Replan:
    """What happened to the old shards: KEPT (whole or with dead rows), DROPPED (re-cut), NEW; MARKED: the kept shards
    with dead rows, DEAD: the dead rows of the plan; ROWS: the plan's rows. PLAN is the new plan as one table when
    replan was given tables (None when it wrote a file)."""

    kept: list[str]
    dropped: list[str]
    new: list[str]
    marked: list[str]
    dead: int
    rows: int
    plan: pa.Table | None = None


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
    """replan_file on tables (tests and small datasets): the rows written are MANIFEST's that OLD_PLAN does not
    hold or TOUCHED names; the result carries the new plan as a table."""
    touched_ids = _array(touched)
    written = pc.or_(
        pc.invert(pc.is_in(manifest.column("id"), value_set=_array(old_plan.column("id")))),
        pc.is_in(manifest.column("id"), value_set=touched_ids),
    )
    with tempfile.TemporaryDirectory(prefix="replan-") as tmp:
        out = Path(tmp) / "plan.parquet"
        rewritten = written.to_numpy(zero_copy_only=False).astype(bool)
        result = replan_file(old_plan, manifest, rewritten, touched_ids, shards, spec, refresh, out, compact)
        plan = pq.read_table(out).replace_schema_metadata(None)
    return Replan(result.kept, result.dropped, result.new, result.marked, result.dead, result.rows, plan)


def replan_file(
    old_plan: Rows,
    manifest: Rows,
    rewritten: np.ndarray,
    touched: pa.Array | pa.ChunkedArray | list[str],
    shards: ShardSpec,
    spec: TransformSpec,
    refresh: int,
    out: Path,
    compact: float = COMPACT_DEAD_FRACTION,
) -> Replan:
    """Write to OUT (one row group per shard, in shard order, as build_plan) OLD_PLAN's shards with the rows of
    TOUCHED (the ids removed or changed since OLD_PLAN) marked dead, plus new shards for the samples of MANIFEST
    that are not live in them: the rows of the mask REWRITTEN (added or changed, manifest order) and the live rows
    of a shard re-cut because more than COMPACT of its rows are dead.

    Memory follows the change, not the dataset: the old plan is read three times a batch at a time (dead counts
    per shard; the live ids of the re-cut shards; the kept rows, merged in shard order with the new ones), the
    manifest once, keeping only the rows to cut. TOUCHED is best an Arrow array (no Python object per row); it is
    made one sorted set once (imgest.core.idset), so a pass costs O(rows x log touched), not a hash set per batch."""
    if not 0 <= compact < 1:
        raise ConfigError(f"compaction threshold {compact} must be at least 0 and below 1 (a fraction of dead rows)")
    touched_ids = IdSet(_array(touched))  # built once: every batch of every pass is looked up in it
    counts, highest = _dead_counts(old_plan, touched_ids)
    dirty = sorted(name for name, (d, n) in counts.items() if d > compact * n)
    dirty_names = IdSet(dirty)
    recut_ids: list[pa.Array] = []  # the live ids of the re-cut shards: cut again with the new samples
    live_kept = 0
    for batch in _batches(old_plan, ["shard", "id", DEAD]):
        live = pc.invert(_dead(batch, touched_ids))
        in_dirty = dirty_names.contains(batch.column("shard"))
        recut_ids.append(batch.column("id").filter(pc.and_(live, in_dirty)))
        live_kept += pc.sum(pc.cast(pc.and_(live, pc.invert(in_dirty)), pa.int64())).as_py() or 0
    schema = _plan_schema(old_plan)
    columns = [name for name in schema.names if name not in PLAN_COLUMNS]  # a newer manifest may hold more
    fresh = _fresh(manifest, columns, rewritten, _concat(recut_ids), live_kept)
    parts = []
    for split in sorted(pc.unique(fresh.column("split")).to_pylist()):
        rows = fresh.filter(pc.equal(fresh.column("split"), split))
        seed = [shards.seed, zlib.crc32(split.encode()), refresh]
        parts.append(with_dead(cut_shards(rows, split, shards, spec, seed, highest.get(split, -1) + 1)).cast(schema))
    new = pa.concat_tables(parts).sort_by([("shard", "ascending"), ("pos", "ascending")]) if parts else None
    kept, marked, dead_rows, written = _merge(old_plan, touched_ids, dirty_names, new, schema, spec, out)
    names = [name for name, _ in written.shards]
    return Replan(sorted(kept), dirty, sorted(set(names) - kept), sorted(marked), dead_rows, written.rows)


def _dead_counts(old_plan: Rows, touched_ids: IdSet) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Per shard of OLD_PLAN [dead rows, rows] (a row is dead when marked so or in TOUCHED_IDS), and per split its
    highest shard index."""
    counts: dict[str, list[int]] = {}  # shard -> [dead rows, rows]
    highest: dict[str, int] = {}  # split -> highest shard index
    for batch in _batches(old_plan, ["split", "shard", "id", DEAD]):
        dead = _dead(batch, touched_ids)
        per = pa.table({"shard": batch.column("shard"), "split": batch.column("split"), "n": pc.cast(dead, pa.int64())})
        for row in per.group_by(["shard", "split"]).aggregate([("n", "sum"), ("n", "count")]).to_pylist():
            seen = counts.setdefault(row["shard"], [0, 0])
            seen[0] += row["n_sum"]
            seen[1] += row["n_count"]
            highest[row["split"]] = max(highest.get(row["split"], -1), shard_index_of(row["shard"]))
    return counts, highest


def _merge(
    old_plan: Rows,
    touched_ids: IdSet,
    dirty_names: IdSet,
    new: pa.Table | None,
    schema: pa.Schema,
    spec: TransformSpec,
    out: Path,
) -> tuple[set[str], set[str], int, PlanFile]:
    """Write to OUT the kept shards of OLD_PLAN (all but DIRTY_NAMES, their touched rows marked dead) merged in
    shard order with the NEW ones; the kept shards, those with dead rows, the dead rows, and the written plan."""
    kept: set[str] = set()
    marked: set[str] = set()
    dead_rows = 0
    with PlanWriter(out, schema, spec) as writer:
        for batch in _batches(old_plan):
            table = pa.Table.from_batches([batch]).replace_schema_metadata(None)
            dead = _dead(batch, touched_ids)
            table = with_dead(table)
            table = table.set_column(table.column_names.index(DEAD), DEAD, dead)
            table = table.filter(pc.invert(dirty_names.contains(table.column("shard")))).cast(schema)
            if not table.num_rows:
                continue
            kept.update(pc.unique(table.column("shard")).to_pylist())
            gone = table.filter(table.column(DEAD))
            marked.update(pc.unique(gone.column("shard")).to_pylist())
            dead_rows += gone.num_rows
            new, before = _split_before(new, table.column("shard")[-1].as_py())
            if before is not None:
                table = pa.concat_tables([table, before]).sort_by([("shard", "ascending"), ("pos", "ascending")])
            writer.add_planned(table)
        if new is not None and new.num_rows:
            writer.add_planned(new)
    return kept, marked, dead_rows, writer.result()


def _fresh(manifest: Rows, columns: list[str], rewritten: np.ndarray, recut: pa.Array, live_kept: int) -> pa.Table:
    """COLUMNS of the rows of MANIFEST to cut into new shards: those of the mask REWRITTEN and those whose id is in
    RECUT. Every other row must be live in a kept shard (LIVE_KEPT of them): a plan that disagrees with its manifest
    is refused, not guessed at."""
    parts, start, total = [], 0, 0
    recut_ids = IdSet(recut)
    for batch in _batches(manifest, columns):
        mask = pa.array(rewritten[start : start + batch.num_rows])
        start += batch.num_rows
        total += batch.num_rows
        if len(recut_ids):
            mask = pc.or_(mask, recut_ids.contains(batch.column("id")))
        if pc.any(mask).as_py():
            parts.append(pa.Table.from_batches([batch.filter(mask)]).select(columns).replace_schema_metadata(None))
    if start != len(rewritten):
        raise ValueError(f"the rewritten mask has {len(rewritten)} rows, the manifest {start}")
    fresh = pa.concat_tables(parts) if parts else _empty(manifest).select(columns)
    if fresh.num_rows + live_kept != total:
        raise BaselineError(
            f"the last version's shard plan holds {live_kept} live rows that stay, but {total - fresh.num_rows} of "
            "the manifest's rows are unchanged: the plan and the baseline disagree; delete the dataset's refresh "
            "folder (baseline, plan and state) so that the next refresh makes a new first version"
        )
    return fresh


def _split_before(new: pa.Table | None, last: str) -> tuple[pa.Table | None, pa.Table | None]:
    """(the rows of NEW, sorted by shard, from shard LAST on; those before it) (None where there are none)."""
    if new is None or not new.num_rows:
        return new, None
    cut = int(pc.sum(pc.cast(pc.less(new.column("shard"), last), pa.int64())).as_py() or 0)
    if not cut:
        return new, None
    return new.slice(cut), new.slice(0, cut)


def _dead(batch: pa.RecordBatch, touched: IdSet) -> pa.Array:
    """The dead flags of a plan BATCH once TOUCHED is removed (rows dead before stay dead)."""
    hit = touched.contains(batch.column("id"))
    if DEAD not in batch.schema.names:
        return hit
    return pc.or_(batch.column(DEAD), hit)


def _batches(rows: Rows, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """ROWS a batch of READ_ROWS at a time (COLUMNS of them that exist; all by default)."""
    if isinstance(rows, pa.Table):
        names = rows.column_names if columns is None else [c for c in columns if c in rows.column_names]
        yield from rows.select(names).to_batches(max_chunksize=READ_ROWS)
        return
    source = pq.ParquetFile(rows)
    names = None if columns is None else [c for c in columns if c in source.schema_arrow.names]
    yield from source.iter_batches(batch_size=READ_ROWS, columns=names)


def _plan_schema(old_plan: Rows) -> pa.Schema:
    schema = old_plan.schema if isinstance(old_plan, pa.Table) else pq.ParquetFile(old_plan).schema_arrow
    schema = schema.remove_metadata()
    return schema if DEAD in schema.names else schema.append(pa.field(DEAD, pa.bool_()))


def _empty(manifest: Rows) -> pa.Table:
    schema = manifest.schema if isinstance(manifest, pa.Table) else pq.ParquetFile(manifest).schema_arrow
    return schema.remove_metadata().empty_table()


def _concat(arrays: list[pa.Array]) -> pa.Array:
    return pa.concat_arrays(arrays) if arrays else pa.array([], pa.string())


def _array(ids: pa.Array | pa.ChunkedArray | list[str]) -> pa.Array:
    """IDS as one Arrow string array."""
    if isinstance(ids, pa.ChunkedArray):
        return ids.combine_chunks() if ids.num_chunks else pa.array([], pa.string())
    return ids if isinstance(ids, pa.Array) else pa.array(ids, pa.string())
