"""Planning shards: a seeded shuffle per split, then cuts by sample count and bytes.

The plan is made before any image is transformed, so shards can be written in parallel and the same
manifest and seed always give the same shards. It is made out of core (build_plan): a split of more than
PLAN_BUCKET_ROWS rows is shuffled in seeded hash buckets spilled to disk, so the planning process holds one
bucket and one shard whatever the dataset's size; a smaller split is one bucket, a global shuffle. Sizes are
known up front in UNCHANGED mode (the source bytes). In JPEG mode the byte limit is applied to an upper bound
of each encoded image (crop x crop x 3 bytes plus headers), so shards come out somewhat smaller than
``max_bytes``, never larger.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from imgest.core.errors import ConfigError
from imgest.core.idhash import id_hashes
from imgest.sinks.shards.plan_cut import ShardSpec, _greedy_cut, _sample_bounds, shard_name, shuffled_order
from imgest.sinks.shards.plan_digest import DEAD, _key_hash, _key_update
from imgest.transform.image import TransformSpec

log = logging.getLogger(__name__)

PLAN_BUCKET_ROWS = 65_536  # a split of more rows is shuffled in buckets of about this many (bounded memory)
SPILL_BATCH_ROWS = 65_536  # manifest rows grouped into buckets at a time while planning
READ_BATCH_ROWS = 8_192  # manifest rows decoded at a time (larger reads hold more memory in the allocator)


@dataclass(frozen=True)
class PlanFile:
    """A shard plan written by build_plan: its file, [(shard name, row group)] in order, its row count, its
    version key (see version_key) and how many of its rows are dead (a refresh's kept shards, see replan)."""

    path: Path
    shards: list[tuple[str, int]]
    rows: int
    key: str
    dead: int = 0

    @property
    def live(self) -> int:
        """The rows the plan's shards deliver: every row but the dead ones."""
        return self.rows - self.dead


def build_plan(
    manifest: Path, out: Path, shards: ShardSpec, spec: TransformSpec, bucket_rows: int = PLAN_BUCKET_ROWS
) -> PlanFile:
    """Plan the shards of MANIFEST and write the plan to OUT (one Parquet row group per shard, see read_shard_table) in
    memory bounded by BUCKET_ROWS rows, whatever the manifest's size.

    Each split is shuffled in buckets: a split of n rows gets K = ceil(n / BUCKET_ROWS) buckets; a row goes to
    the bucket its id hashes to (seeded), every bucket is sorted by id and permuted with a seed of its own, and
    the buckets follow each other in order, cut greedily into shards as one stream (a shard may straddle two
    buckets). Every bucket is a seeded random subset of the split, so shards mix classes as a global shuffle
    does. A split of at most BUCKET_ROWS rows is one bucket shuffled with the split's seed: exactly the plan of
    a global shuffle (the plans of such datasets did not change). The rows are spilled once to an Arrow file
    beside OUT, removed when done; OUT appears whole or not at all. The same manifest, seed and BUCKET_ROWS
    always give the same plan."""
    if bucket_rows < 1:
        raise ConfigError(f"plan bucket rows {bucket_rows} must be at least 1")
    source = pq.ParquetFile(manifest, pre_buffer=False)  # read in order: nothing to coalesce, less held
    schema = source.schema_arrow.append(pa.field("shard", pa.string())).append(pa.field("pos", pa.int32()))
    counts = _split_counts(source)
    buckets = {split: max(1, -(-n // bucket_rows)) for split, n in counts.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".plan-spill-", dir=out.parent) as tmp:
        spill = _spill(source, Path(tmp) / "rows.arrow", buckets, shards.seed)
        with PlanWriter(out, schema, spec) as writer, pa.OSFile(str(spill.path)) as fh:
            reader = pa.ipc.open_file(fh)
            for split in sorted(counts):
                state = (0, 0, 0)
                for bucket in range(buckets[split]):
                    pieces = [reader.get_batch(i) for i in spill.batches.get((split, bucket), [])]
                    rows = pa.Table.from_batches(pieces, source.schema_arrow)
                    rows = rows.take(
                        shuffled_order(rows.select(["id"]), _bucket_seed(shards.seed, split, bucket, buckets[split]))
                    )
                    state = writer.add(rows, split, shards, spec, state)
    plan = writer.result()
    log.info(
        "planned %d rows of %s into %d shards (buckets per split: %s)", plan.rows, manifest, len(plan.shards), buckets
    )
    return plan


def plan_shards(
    manifest: Path, shards: ShardSpec, spec: TransformSpec, bucket_rows: int = PLAN_BUCKET_ROWS
) -> pa.Table:
    """The plan of build_plan as one table (manifest rows with their shard name and position, in shard order):
    for tests, small datasets and a refresh's re-plan. A job writes it with build_plan instead, in bounded
    memory."""
    with tempfile.TemporaryDirectory(prefix="imgest-plan-") as tmp:
        plan = build_plan(manifest, Path(tmp) / "plan.parquet", shards, spec, bucket_rows)
        return pq.read_table(plan.path)


def _split_counts(source: pq.ParquetFile) -> dict[str, int]:
    """Rows per split of a manifest, read a batch of the split column at a time."""
    counts: dict[str, int] = {}
    for batch in source.iter_batches(batch_size=READ_BATCH_ROWS, columns=["split"], use_threads=False):
        for item in pc.value_counts(batch.column(0)).to_pylist():
            counts[item["values"]] = counts.get(item["values"], 0) + item["counts"]
    return counts


@dataclass
class _Spill:
    """Rows spilled to an Arrow IPC file: the record batches of each (split, bucket), in manifest order."""

    path: Path
    batches: dict[tuple[str, int], list[int]]


def _spill(source: pq.ParquetFile, path: Path, buckets: dict[str, int], seed: int) -> _Spill:
    """Write the manifest's rows to PATH grouped by (split, bucket) within each group of rows read: memory stays
    one group whatever the manifest's size."""
    index: dict[tuple[str, int], list[int]] = {}
    order = sorted(buckets)
    base = np.cumsum([0] + [buckets[s] for s in order])
    written = 0
    options = pa.ipc.IpcWriteOptions(compression="lz4")
    with pa.OSFile(str(path), "wb") as fh, pa.ipc.new_file(fh, source.schema_arrow, options=options) as writer:
        for rows in _read_groups(source, SPILL_BATCH_ROWS):
            split_code = pc.index_in(rows.column("split"), value_set=pa.array(order, pa.string())).to_numpy()
            k = np.asarray([buckets[s] for s in order], dtype=np.uint64)[split_code]
            group = base[split_code] + (id_hashes(rows.column("id"), seed) % k).astype(np.int64)
            sort = np.argsort(group, kind="stable")
            rows, group = rows.take(pa.array(sort)), group[sort]
            for start, end in _runs(group):
                split_index = int(np.searchsorted(base, group[start], side="right")) - 1
                batches = index.setdefault((order[split_index], int(group[start] - base[split_index])), [])
                for batch in rows.slice(start, end - start).to_batches():
                    writer.write_batch(batch)
                    batches.append(written)
                    written += 1
    return _Spill(path, index)


def _read_groups(source: pq.ParquetFile, rows: int) -> Iterator[pa.Table]:
    """SOURCE's rows in tables of about ROWS rows, read in small batches (the reader's buffers stay small)."""
    pending: list[pa.RecordBatch] = []
    count = 0
    for batch in source.iter_batches(batch_size=READ_BATCH_ROWS, use_threads=False):  # threads hold more
        pending.append(batch)
        count += batch.num_rows
        if count >= rows:
            yield pa.Table.from_batches(pending)
            pending, count = [], 0
    if pending:
        yield pa.Table.from_batches(pending)


def _bucket_seed(seed: int, split: str, bucket: int, count: int) -> list[int]:
    """The permutation seed of one bucket: a split of one bucket keeps the global shuffle's [seed, crc32(split)]."""
    base = [seed, zlib.crc32(split.encode())]
    return base if count == 1 else [*base, count, bucket]


class PlanWriter:
    """Writes a plan in shard order, one row group per shard, to OUT (a partial file renamed when complete); a shard
    whose rows come in pieces is held until it closes (at most one shard's rows in memory). Feeds the version key
    as it writes."""

    def __init__(self, out: Path, schema: pa.Schema, spec: TransformSpec) -> None:
        self.out, self.schema = out, schema
        self.partial = out.with_name(out.name + ".partial")
        self.key = _key_hash(spec)
        self.transform = spec.as_dict()
        self.order: list[tuple[str, int]] = []
        self.rows = 0
        self.dead = 0
        self._name: str | None = None
        self._pending: list[pa.Table] = []
        self._writer = pq.ParquetWriter(self.partial, schema, compression="zstd")

    def __enter__(self) -> PlanWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            self._flush()
        self._writer.close()
        if kind is None:
            size = self.partial.stat().st_size
            sidecar(self.out).unlink(missing_ok=True)  # never beside a plan it does not describe
            self.partial.replace(self.out)
            _write_sidecar(self.result(), size, self.transform)
        else:
            self.partial.unlink(missing_ok=True)

    def result(self) -> PlanFile:
        """The written plan (after the with block)."""
        return PlanFile(self.out, self.order, self.rows, self.key.hexdigest()[:16], self.dead)

    def add(
        self, rows: pa.Table, split: str, shards: ShardSpec, spec: TransformSpec, state: tuple[int, int, int]
    ) -> tuple[int, int, int]:
        """ROWS in their shuffled order, cut on from STATE (index, count, used); returns the state after them."""
        shard, pos, state = _greedy_cut(_sample_bounds(rows.column("size").to_numpy(), spec), shards, state)
        for start, end in _runs(shard):
            name = shard_name(split, int(shard[start]))
            piece = rows.slice(start, end - start)
            piece = piece.append_column("shard", pa.repeat(pa.scalar(name, pa.string()), end - start))
            self._put(name, piece.append_column("pos", pa.array(pos[start:end], pa.int32())))
        return state

    def add_planned(self, rows: pa.Table) -> None:
        """ROWS of a plan (shard and pos columns), in shard order."""
        codes = pc.dictionary_encode(rows.column("shard")).combine_chunks()
        for start, end in _runs(codes.indices.to_numpy()):
            self._put(codes.dictionary[codes.indices[start].as_py()].as_py(), rows.slice(start, end - start))

    def _put(self, name: str, piece: pa.Table) -> None:
        if name != self._name:
            self._flush()
            self._name = name
        self._pending.append(piece)

    def _flush(self) -> None:
        if self._name is None:
            return
        table = pa.concat_tables(self._pending).cast(self.schema)
        self._writer.write_table(table, row_group_size=table.num_rows)
        _key_update(self.key, table)
        self.order.append((self._name, len(self.order)))
        self.rows += table.num_rows
        if DEAD in table.column_names:
            self.dead += int(pc.sum(pc.cast(table.column(DEAD), pa.int64())).as_py() or 0)
        self._name, self._pending = None, []


def sidecar(plan: Path) -> Path:
    """The JSON file beside a plan that PlanWriter wrote: its shards, rows, key, size and transform."""
    return plan.with_name(plan.name + ".json")


def _write_sidecar(plan: PlanFile, size: int, transform: dict[str, Any]) -> None:
    info = {"shards": plan.shards, "rows": plan.rows, "key": plan.key, "dead": plan.dead}
    info.update(size=size, transform=transform)
    partial = sidecar(plan.path).with_name(sidecar(plan.path).name + ".partial")
    partial.write_text(json.dumps(info))
    partial.replace(sidecar(plan.path))


def written_plan(plan: Path, spec: TransformSpec) -> PlanFile | None:
    """PLAN as PlanWriter wrote it for SPEC (one row group per shard, its key known), from its sidecar; None when it
    has none, or one that does not match the file (size, rows, row groups) or SPEC."""
    try:
        info = json.loads(sidecar(plan).read_text())
        meta = pq.ParquetFile(plan).metadata
        shards = [(str(name), int(group)) for name, group in info.get("shards", [])]
    except (OSError, ValueError, TypeError, AttributeError, pa.ArrowException):
        return None
    if (
        info.get("transform") != spec.as_dict()
        or info.get("size") != plan.stat().st_size
        or info.get("rows") != meta.num_rows
        or len(shards) != meta.num_row_groups
    ):
        return None
    return PlanFile(plan, shards, int(info["rows"]), str(info["key"]), int(info.get("dead", 0)))


def take_plan(plan: Path, out: Path, spec: TransformSpec) -> PlanFile:
    """The plan file PLAN (a refresh's) at OUT, one row group per shard: copied byte for byte when PlanWriter wrote
    it for SPEC (its sidecar says so, and carries the key), else rewritten by copy_plan (a batch at a time)."""
    written = written_plan(plan, spec)
    if written is None:
        log.info("%s has no matching sidecar: rewriting it one row group per shard", plan)
        return copy_plan(plan, out, spec)
    log.info(
        "taking the plan %s as written: %d shards, %d rows (%d dead), key %s",
        plan,
        len(written.shards),
        written.rows,
        written.dead,
        written.key,
    )
    if plan.resolve() != out.resolve():
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(plan, out)
        shutil.copyfile(sidecar(plan), sidecar(out))
    return PlanFile(out, written.shards, written.rows, written.key, written.dead)


def _runs(values: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of every run of equal VALUES."""
    if not len(values):
        return []
    starts = np.flatnonzero(np.r_[True, values[1:] != values[:-1]]).tolist()
    return list(zip(starts, [*starts[1:], len(values)], strict=True))


def copy_plan(plan: Path, out: Path, spec: TransformSpec) -> PlanFile:
    """Rewrite the plan file PLAN (rows in shard order, any row groups: a refresh's) to OUT with one row group per
    shard, streaming a batch at a time; returns it with its version key."""
    source = pq.ParquetFile(plan)
    with PlanWriter(out, source.schema_arrow, spec) as writer:
        for batch in source.iter_batches(batch_size=READ_BATCH_ROWS, use_threads=False):  # threads hold more
            writer.add_planned(pa.Table.from_batches([batch]))
    return writer.result()


def read_shard_table(path: Path | pq.ParquetFile, row_group: int, columns: list[str] | None = None) -> pa.Table:
    """The planned rows of one shard, in shard order, as a table (COLUMNS of it when given and in the plan). PATH
    may be the plan already open (its footer is read once for many shards)."""
    source = path if isinstance(path, pq.ParquetFile) else pq.ParquetFile(path)
    if columns is not None:
        columns = [c for c in columns if c in source.schema_arrow.names]
    return source.read_row_group(row_group, columns=columns)
