"""Text columns without a Python object per value: Arrow text as fixed-width bytes, hex sha256 as digests, 16-byte
UUIDs as their strings (what the checks, the splits and validation hold per image, at 1.33 M rows and more)."""

from __future__ import annotations

from typing import Any

import numpy as np

_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_DIGITS_AT = np.r_[0:8, 9:13, 14:18, 19:23, 24:36]  # where the 32 hex digits go in a 36-character UUID string
_HEX = np.full(256, 255, np.uint8)
_HEX[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10)
_HEX[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16)
_HEX[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16)


def bytes_column(column: Any) -> np.ndarray:
    """A text column (no nulls) as fixed-width bytes (UTF-8), built from Arrow's buffers without a Python object
    per value."""
    import pyarrow as pa

    arr = column.cast(pa.binary())
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], np.int32)[arr.offset : arr.offset + n + 1]
    lengths = np.diff(offsets)
    width = max(1, int(lengths.max()) if n else 1)
    data = np.frombuffer(arr.buffers()[2], np.uint8)[offsets[0] : offsets[-1]] if n else np.zeros(0, np.uint8)
    starts = offsets[:-1] - offsets[0]
    out = np.zeros((n, width), np.uint8)
    for j in range(width):  # one byte position of every value at a time
        has = lengths > j
        out[has, j] = data[starts[has] + j]
    return out.view(f"S{width}").reshape(n)


def sha_columns(column: Any) -> tuple[np.ndarray, np.ndarray]:
    """(n, 32) uint8 digests and a recorded mask from a column of hex sha256 (null or not 64 hex digits: not
    recorded, digest zero)."""
    import pyarrow.compute as pc

    text = column.fill_null("")
    hexes = bytes_column(text).astype("S64")  # shorter ones pad with NUL, which is no hex digit
    nibbles = _HEX[np.frombuffer(hexes.tobytes(), np.uint8).reshape(-1, 64)]
    recorded = (pc.binary_length(text).to_numpy(zero_copy_only=False) == 64) & (nibbles != 255).all(axis=1)
    digests = (nibbles[:, 0::2] << 4) | nibbles[:, 1::2]
    digests[~recorded] = 0
    return digests, recorded


def recorded_digests(column: Any, where: str) -> tuple[np.ndarray, np.ndarray]:
    """sha_columns of COLUMN for a check that must trust them: null or empty is not recorded, anything else that is
    not 64 hex digits raises NotReadableError naming WHERE (a version to verify again, not a row to skip)."""
    import pyarrow.compute as pc

    from imgest.core.errors import NotReadableError

    digests, recorded = sha_columns(column)
    given = pc.fill_null(pc.binary_length(column), 0).to_numpy(zero_copy_only=False) > 0
    if (given & ~recorded).any():
        raise NotReadableError(f"{where} holds a sha256 that is not 64 hex digits; re-verify the version")
    return digests, recorded


def uuid_text(ids: np.ndarray) -> np.ndarray:
    """16-byte UUIDs ('S16') as their lowercase strings' bytes, an (n, 36) uint8 array (no Python object per id)."""
    raw = np.frombuffer(np.ascontiguousarray(ids).tobytes(), np.uint8).reshape(-1, 16)
    digits = np.empty((len(raw), 32), dtype=np.uint8)
    digits[:, 0::2], digits[:, 1::2] = raw >> 4, raw & 15
    text = np.full((len(raw), 36), ord("-"), dtype=np.uint8)
    text[:, _DIGITS_AT] = _DIGITS[digits]
    return text
