"""Cutting shards: the shard spec and names, each sample's byte bound, and the greedy cut of a shuffled stream
of samples into shards by count and bytes (imgest.sinks.shards.plan buckets the rows and calls it)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from imgest.sinks.shards.shard_spec import ShardSpec  # re-exported: callers name it plan_cut's or plan's
from imgest.sinks.shards.tar_writer import BLOCK, member_overhead
from imgest.transform.image import TransformSpec

JSON_BOUND = 1024  # the .json member of a sample stays below this


def image_bound(size: int, spec: TransformSpec) -> int:
    """Upper bound of the stored image's bytes for a source of SIZE bytes."""
    return size if spec.mode == "unchanged" else spec.crop * spec.crop * 3 + 4096


def sample_bound(size: int, spec: TransformSpec) -> int:
    """Upper bound of a whole sample in the tar (image, .cls and .json members)."""
    return member_overhead(image_bound(size, spec)) + member_overhead(8) + member_overhead(JSON_BOUND)


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:06d}.tar"


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
    shard, pos, _ = _greedy_cut(need, shards, (0, 0, 0))
    count = int(shard[-1]) + 1 if len(need) else 0
    names = pa.array([shard_name(split, first + k) for k in range(count)], pa.string())
    return names.take(pa.array(shard)), pa.array(pos)


def _greedy_cut(
    need: np.ndarray, shards: ShardSpec, state: tuple[int, int, int]
) -> tuple[np.ndarray, np.ndarray, tuple[int, int, int]]:
    """(shard index, position) of each sample of byte bound NEED, and the state after them: a shard closes when
    the next sample would pass max_count or max_bytes. STATE (index, count, used) is where an earlier stream of
    samples left the open shard, so a stream cut in pieces gets the cut of the whole. Equal bounds (JPEG mode) are
    cut arithmetically; others in a loop over chunks."""
    n = len(need)
    index, count, used = state
    if n and int(need.min()) == int(need.max()) and used == count * int(need[0]):
        per = max(1, min(shards.max_count, shards.max_bytes // int(need[0])))
        if count <= per:
            at = np.arange(count, count + n, dtype=np.int64)
            last = count + n - 1
            return (
                index + at // per,
                (at % per).astype(np.int32),
                (index + last // per, last % per + 1, (last % per + 1) * int(need[0])),
            )
    shard = np.empty(n, dtype=np.int64)
    pos = np.empty(n, dtype=np.int32)
    for start in range(0, n, 65_536):
        for i, size in enumerate(need[start : start + 65_536].tolist(), start):
            if count and (count >= shards.max_count or used + size > shards.max_bytes):
                index, count, used = index + 1, 0, 0
            shard[i], pos[i] = index, count
            count, used = count + 1, used + size
    return shard, pos, (index, count, used)


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
