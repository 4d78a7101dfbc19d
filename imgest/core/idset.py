"""A fixed set of string ids asked about many batches: built once as a numpy hash table of fixed-width keys.

``pyarrow.compute.is_in`` builds a hash set of its value set on every call, so asking it of a stream of batches
costs the set's size once per batch: O(rows x set / batch). ``IdSet`` builds its table once (numpy fixed-width
keys, their 64-bit hashes, an open-addressing table of at least twice their count) and each batch costs
O(batch): a pass costs the same whatever the batch size.

A key is the id's bytes padded with NULs, then its length (4 bytes, big endian), 8-byte aligned: the length keeps
``"a"`` and ``"a\\0"`` apart. A lookup probes from its hash's slot until an empty one and compares the whole key
wherever the hashes are equal, so it answers exactly what ``is_in`` answers. Nulls are never members
(``is_in``'s answer when the set has none).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

_LENGTH = 4  # bytes of the length suffix of a key
_PRIME = np.uint64(0x9E3779B97F4A7C15)


class IdSet:
    """IDS (strings or binary, as Arrow or a list) as a set that many batches can be checked against."""

    def __init__(self, ids: pa.Array | pa.ChunkedArray | Sequence[str]) -> None:
        arr = _one_array(ids)
        arr = arr.drop_null() if arr.null_count else arr
        offsets, _ = _offsets_and_data(arr)
        self.width = int(np.diff(offsets).max()) if len(arr) else 0
        matrix, _ = _keys(arr, self.width)
        self._keys, self._hashes = _as_bytes(matrix), _hash(matrix)
        self._mask = np.uint64((1 << (2 * len(arr)).bit_length()) - 1)  # at least twice the keys: probes stay short
        self._slots = _table(self._hashes, self._mask)

    def __len__(self) -> int:
        """Ids held (a repeated id counts each time)."""
        return len(self._keys)

    def contains(self, ids: pa.Array | pa.ChunkedArray) -> pa.BooleanArray:
        """Per row of IDS, whether it is in the set (as ``pc.is_in(IDS, value_set=...)``)."""
        arr = _one_array(ids)
        if not len(self._keys) or not len(arr):
            return pa.array(np.zeros(len(arr), dtype=bool))
        matrix, fits = _keys(arr, self.width)
        keys, hashes = _as_bytes(matrix), _hash(matrix)
        hit = np.zeros(len(keys), dtype=bool)
        rows, at = np.flatnonzero(fits), hashes & self._mask
        at = at[rows]
        while len(rows):  # linear probing, every row still looking at once, until a match or an empty slot
            slot = self._slots[at]
            full = slot >= 0
            rows, at, slot = rows[full], at[full], slot[full]
            same = self._hashes[slot] == hashes[rows]
            same[same] = self._keys[slot[same]] == keys[rows[same]]
            hit[rows[same]] = True
            rows, at = rows[~same], (at[~same] + np.uint64(1)) & self._mask
        return pa.array(hit)


def _table(hashes: np.ndarray, mask: np.uint64) -> np.ndarray:
    """An open-addressing table of HASHES (linear probing): per slot the index of a key, -1 where empty."""
    slots = np.full(int(mask) + 1, -1, dtype=np.int32 if len(hashes) < 2**31 else np.int64)
    pending, at = np.arange(len(hashes)), hashes & mask
    while len(pending):
        free = slots[at] == -1
        slots[at[free]] = pending[free]  # of the keys claiming one free slot, one wins
        won = slots[at] == pending
        pending, at = pending[~won], (at[~won] + np.uint64(1)) & mask
    return slots


def _one_array(ids: pa.Array | pa.ChunkedArray | Sequence[str]) -> pa.Array:
    """IDS as one Arrow array of a string or binary type."""
    if isinstance(ids, pa.ChunkedArray):
        arr = ids.combine_chunks() if ids.num_chunks else pa.array([], ids.type)
    else:
        arr = ids if isinstance(ids, pa.Array) else pa.array(list(ids), pa.string())
    kinds = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary)
    if not any(kind(arr.type) for kind in kinds):
        raise TypeError(f"ids must be strings or binary, not {arr.type}")
    return arr


def _offsets_and_data(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(the n + 1 offsets of ARR's values, its data buffer as uint8), honouring a slice's offset."""
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    dtype = np.dtype(np.int64 if large else np.int32)
    buffers = arr.buffers()
    if not len(arr):
        return np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.uint8)
    offsets = np.frombuffer(buffers[1], dtype=dtype, count=len(arr) + 1, offset=arr.offset * dtype.itemsize)
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, dtype=np.uint8)
    return offsets.astype(np.int64), data


def _as_bytes(matrix: np.ndarray) -> np.ndarray:
    """The rows of a C-contiguous (n, w) uint8 MATRIX as an (n,) fixed-width bytes array ('S<w>')."""
    return matrix.view(f"S{matrix.shape[1]}").ravel()


def _hash(matrix: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each row of an (n, 8k) uint8 MATRIX: its k little-endian words folded through splitmix64."""
    words = matrix.view("<u8")
    h = np.zeros(len(matrix), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(words.shape[1]):
            h = (h ^ words[:, j]) * _PRIME
            h ^= h >> np.uint64(29)
            h *= np.uint64(0xBF58476D1CE4E5B9)
            h ^= h >> np.uint64(32)
    return h


def _keys(arr: pa.Array, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(ARR's keys as an (n, 8k) uint8 matrix: bytes NUL-padded past WIDTH, the length in the last 4 bytes; which
    rows are valid and at most WIDTH long)."""
    offsets, data = _offsets_and_data(arr)
    lengths = np.diff(offsets)
    n = len(lengths)
    fits = lengths <= width
    if arr.null_count:
        fits &= arr.is_valid().to_numpy(zero_copy_only=False)
    out = np.zeros((n, -(-(width + _LENGTH) // 8) * 8), dtype=np.uint8)
    out[:, -_LENGTH:] = lengths.astype(">u4").view(np.uint8).reshape(n, _LENGTH)
    if n and lengths.min() == lengths.max():  # one length (UUIDs): a reshape of the data buffer
        size = int(lengths[0])
        if size <= width:
            out[:, :size] = data[offsets[0] : offsets[-1]].reshape(n, size)
    elif n:
        rows = np.flatnonzero(fits)
        size = lengths[rows]
        column = np.arange(int(size.sum())) - np.repeat(np.cumsum(size) - size, size)
        out[np.repeat(rows, size), column] = data[np.repeat(offsets[:-1][rows], size) + column]
    return out, fits
