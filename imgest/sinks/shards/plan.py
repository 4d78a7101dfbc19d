"""Planning shards: a seeded global shuffle per split, then cuts by sample count and bytes.

The plan is made before any image is transformed, so shards can be written in parallel and the same
manifest and seed always give the same shards. Sizes are known up front in UNCHANGED mode (the source
bytes). In JPEG mode the byte limit is applied to an upper bound of each encoded image (crop x crop x 3
bytes plus headers), so shards come out somewhat smaller than ``max_bytes``, never larger.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from imgest.core import defaults
from imgest.core.errors import ConfigError
from imgest.sinks.shards.tar_writer import BLOCK, member_overhead
from imgest.transform.image import TransformSpec

JSON_BOUND = 1024  # the .json member of a sample stays below this


@dataclass(frozen=True)
class ShardSpec:
    """How to cut shards."""

    max_count: int = defaults.SHARD_MAX_COUNT
    max_bytes: int = defaults.SHARD_MAX_BYTES
    seed: int = defaults.SHUFFLE_SEED

    def __post_init__(self) -> None:
        if self.max_count < 1:
            raise ConfigError(f"shard max count {self.max_count} must be at least 1")
        if self.max_bytes < 64 * 1024:
            raise ConfigError(f"shard max bytes {self.max_bytes} must be at least 64 KiB")


def image_bound(size: int, spec: TransformSpec) -> int:
    """Upper bound of the stored image's bytes for a source of SIZE bytes."""
    return size if spec.mode == "unchanged" else spec.crop * spec.crop * 3 + 4096


def sample_bound(size: int, spec: TransformSpec) -> int:
    """Upper bound of a whole sample in the tar (image, .cls and .json members)."""
    return member_overhead(image_bound(size, spec)) + member_overhead(8) + member_overhead(JSON_BOUND)


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:06d}.tar"


def plan_shards(manifest: Path, shards: ShardSpec, spec: TransformSpec) -> pa.Table:
    """The manifest rows with their shard name and position, in shard order (deterministic). The order of every
    split is computed as indices from the id and size columns, then the rows are taken from the manifest once:
    the only copies of the whole table are the manifest and the plan."""
    table = pq.read_table(manifest)
    takes, names, positions = [], [], []
    for split in sorted(pc.unique(table.column("split")).to_pylist()):
        where = pc.indices_nonzero(pc.equal(table.column("split"), split))
        keys = table.select(["id", "size"]).take(where)
        order = shuffled_order(keys.select(["id"]), [shards.seed, zlib.crc32(split.encode())])
        shard, pos = _assign(keys.column("size").take(order), split, shards, spec, 0)
        takes.append(where.take(order))
        names.append(shard)
        positions.append(pos)
    if not takes:
        return table
    plan = table.take(pa.chunked_array(takes).combine_chunks())
    del table
    return plan.append_column("shard", pa.chunked_array(names)).append_column("pos", pa.chunked_array(positions))


def shuffled_order(rows: pa.Table, seed: list[int]) -> pa.Array:
    """Positions of ROWS sorted by id (independent of manifest order), then in a SEED-shuffled order."""
    by_id = pc.sort_indices(rows, sort_keys=[("id", "ascending")])
    return by_id.take(pa.array(np.random.default_rng(seed).permutation(rows.num_rows)))


def cut_shards(
    rows: pa.Table, split: str, shards: ShardSpec, spec: TransformSpec, seed: list[int], first: int
) -> pa.Table:
    """ROWS (one split) in a SEED-shuffled order, cut into shards named from index FIRST, with positions."""
    return _cut(rows.take(shuffled_order(rows, seed)), split, shards, spec, first)


def _cut(rows: pa.Table, split: str, shards: ShardSpec, spec: TransformSpec, first: int) -> pa.Table:
    """ROWS, already in their shuffled order, cut into shards named from index FIRST, with positions."""
    shard, pos = _assign(rows.column("size"), split, shards, spec, first)
    return rows.append_column("shard", shard).append_column("pos", pos)


def _assign(
    sizes: pa.Array | pa.ChunkedArray, split: str, shards: ShardSpec, spec: TransformSpec, first: int
) -> tuple[pa.Array, pa.Array]:
    """(shard name, position) columns for samples of source SIZES in their shuffled order."""
    need = _sample_bounds(sizes.to_numpy(zero_copy_only=False), spec)
    shard, pos = _greedy_cut(need, shards)
    count = int(shard[-1]) + 1 if len(need) else 0
    names = pa.array([shard_name(split, first + k) for k in range(count)], pa.string())
    return names.take(pa.array(shard)), pa.array(pos)


def _greedy_cut(need: np.ndarray, shards: ShardSpec) -> tuple[np.ndarray, np.ndarray]:
    """(shard index, position) of each sample of byte bound NEED: a shard closes when the next sample would pass
    max_count or max_bytes. Equal bounds (JPEG mode) are cut arithmetically; others in a loop over chunks."""
    n = len(need)
    if n and int(need.min()) == int(need.max()):
        per = max(1, min(shards.max_count, shards.max_bytes // int(need[0])))
        idx = np.arange(n, dtype=np.int64)
        return idx // per, (idx % per).astype(np.int32)
    shard = np.empty(n, dtype=np.int64)
    pos = np.empty(n, dtype=np.int32)
    index, count, used = 0, 0, 0
    for start in range(0, n, 65_536):
        for i, size in enumerate(need[start : start + 65_536].tolist(), start):
            if count and (count >= shards.max_count or used + size > shards.max_bytes):
                index, count, used = index + 1, 0, 0
            shard[i], pos[i] = index, count
            count, used = count + 1, used + size
    return shard, pos


def _sample_bounds(sizes: np.ndarray, spec: TransformSpec) -> np.ndarray:
    """sample_bound of every size, as one array (the same numbers, without a Python call per row)."""
    image = (
        sizes.astype(np.int64) if spec.mode == "unchanged" else np.full(len(sizes), spec.crop * spec.crop * 3 + 4096)
    )
    return _member(image) + member_overhead(8) + member_overhead(JSON_BOUND)


def _member(size: np.ndarray) -> np.ndarray:
    return BLOCK + -(-size // BLOCK) * BLOCK


def shard_index_of(name: str) -> int:
    """'train-000012.tar' -> 12."""
    return int(name.removesuffix(".tar").rsplit("-", 1)[1])


def shard_digest(rows: list[dict[str, object]], spec: TransformSpec) -> str:
    """Identity of a shard's inputs: member ids, source sizes and mtimes, transform. Same digest, same bytes."""
    h = hashlib.sha256(json.dumps(spec.as_dict(), sort_keys=True).encode())
    for row in rows:
        h.update(f"{row['id']}|{row['size']}|{row['mtime']}|{row['label']}\n".encode())
    return h.hexdigest()


def version_key(plan: pa.Table, spec: TransformSpec) -> str:
    """The content key of a shard plan: a digest of the transform and every row's shard, id, size, mtime and
    label in plan order (never of time or attempt). Its shards go under ``v/<key>/``: the same plan always
    writes the same names, so a re-run finds what an interrupted one wrote."""
    h = hashlib.sha256(json.dumps(spec.as_dict(), sort_keys=True).encode())
    columns = ["shard", "id", "size", "mtime", "label"]
    for batch in plan.select(columns).to_batches(max_chunksize=65_536):  # bounded: one chunk of text at a time
        values = [batch.column(c).to_pylist() for c in columns]
        h.update("".join(f"{s}|{i}|{z}|{m}|{lab}\n" for s, i, z, m, lab in zip(*values, strict=True)).encode())
    return h.hexdigest()[:16]


def write_plan(plan: pa.Table, path: Path) -> list[tuple[str, int]]:
    """Write PLAN with one Parquet row group per shard; returns [(shard name, row group)] in order.

    A task then reads exactly its shard's rows, with no shuffle: see read_shard_rows.
    """
    shard = plan.column("shard")
    changes = pc.not_equal(shard.slice(1), shard.slice(0, max(0, len(shard) - 1))) if len(shard) > 1 else None
    bounds = (np.flatnonzero(changes.to_numpy(zero_copy_only=False)) + 1).tolist() if changes is not None else []
    starts, ends = [0, *bounds], [*bounds, len(shard)]
    names = [shard[start].as_py() for start in starts] if len(shard) else []
    order = []
    with pq.ParquetWriter(path, plan.schema, compression="zstd") as writer:
        for group, (start, end) in enumerate(zip(starts, ends, strict=True)):
            writer.write_table(plan.slice(start, end - start), row_group_size=end - start)
            order.append((names[group], group))
    return order


def read_shard_rows(path: Path, row_group: int) -> list[dict[str, object]]:
    """The planned rows of one shard, in shard order."""
    return pq.ParquetFile(path).read_row_group(row_group).to_pylist()
