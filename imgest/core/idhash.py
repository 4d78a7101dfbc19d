"""Seeded 64-bit hashes of sample ids, vectorized over an Arrow string column: the shard plan's split buckets and
the diff index of a refresh both key on them, so the same ids and seed give the same hashes on every machine."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from imgest.core.errors import ImgestError

_FNV_OFFSET, _FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)


def id_hashes(ids: pa.Array | pa.ChunkedArray, seed: int) -> np.ndarray:
    """A seeded 64-bit hash of every id (FNV-1a over its UTF-8 bytes, then a splitmix64 finish), vectorized over
    the string buffer: the same ids and seed give the same hashes on every machine."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    if ids.null_count:
        raise ImgestError("sample ids must not be null: re-run the scan to rebuild the manifest")
    ids = ids.cast(pa.large_string())
    offsets = np.frombuffer(ids.buffers()[1], dtype=np.int64)[ids.offset : ids.offset + len(ids) + 1]
    data = ids.buffers()[2]
    raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    h = np.full(len(ids), _FNV_OFFSET, dtype=np.uint64) ^ _mix(np.asarray([seed & (2**64 - 1)], np.uint64))
    for j in range(int(lengths.max()) if len(ids) else 0):
        live = lengths > j
        if live.all():
            h = (h ^ raw[starts + j]) * _FNV_PRIME
        else:
            h[live] = (h[live] ^ raw[starts[live] + j]) * _FNV_PRIME
    return _mix(h)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finish: every input bit moves every output bit (so a modulo of the hash is uniform)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))
