"""What identifies shards and versions: a shard's digest (its inputs and the transform: same digest, same bytes)
and a plan's version key (every row, its shard and whether it is dead)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from imgest.transform.image import TransformSpec

DEAD = "dead"  # a refresh plan's column: True for a row of a kept shard that is no longer live (see replan)
DIGEST_COLUMNS = ("id", "size", "mtime", "label")  # what a shard's digest is made of, with the transform


def shard_digest(rows: list[dict[str, object]], spec: TransformSpec) -> str:
    """Identity of a shard's inputs: member ids, source sizes and mtimes, transform. Same digest, same bytes."""
    return _digest(spec, ([row[c] for c in DIGEST_COLUMNS] for row in rows))


def shard_table_digest(rows: pa.Table, spec: TransformSpec) -> str:
    """shard_digest of a shard's plan rows as an Arrow table, the same text hashed, written by Arrow's kernels (no
    Python object per row; see _lines)."""
    lines = _lines(rows, list(DIGEST_COLUMNS))
    if lines is None:
        return _digest(spec, zip(*(rows.column(c).to_pylist() for c in DIGEST_COLUMNS), strict=True))
    h = hashlib.sha256(json.dumps(spec.as_dict(), sort_keys=True).encode())
    _feed(h, pc.binary_join_element_wise(lines, "", "\n"))
    return h.hexdigest()


def _lines(rows: pa.Table, columns: list[str]) -> pa.ChunkedArray | pa.Array | None:
    """Each row's COLUMNS joined by '|' as Python's str prints them, by Arrow's kernels; None where they may differ.
    Arrow and repr print a float's shortest digits in fixed notation for magnitudes in [1e-4, 1e10) (every mtime
    in seconds until the year 2286), Arrow without repr's ".0" on a whole number (added here); a float outside that
    range, not finite, or a null makes it None (the caller's own loop then)."""
    text = []
    for name in columns:
        values = rows.column(name)
        if values.null_count:
            return None
        if pa.types.is_floating(values.type) and not pa.types.is_float64(values.type):
            return None  # a narrower float prints otherwise than repr of its value
        if pa.types.is_float64(values.type):
            size = pc.abs(values)
            fixed = pc.and_(pc.greater_equal(size, 1e-4), pc.less(size, 1e10))
            if len(values) and not pc.all(pc.or_(fixed, pc.equal(values, 0.0))).as_py():
                return None
            printed = pc.cast(values, pa.string())
            whole = pc.binary_join_element_wise(printed, "0", ".")
            text.append(pc.if_else(pc.equal(pc.floor(values), values), whole, printed))
        else:
            text.append(pc.cast(values, pa.string()))
    return pc.binary_join_element_wise(*text, "|")


def _feed(h: Any, lines: pa.ChunkedArray | pa.Array) -> None:
    """Feed the bytes of string array LINES, one after another, to hash H (its data buffer, no copy per row)."""
    for chunk in lines.chunks if isinstance(lines, pa.ChunkedArray) else [lines]:
        if len(chunk):
            offsets = np.frombuffer(chunk.buffers()[1], np.int32)[chunk.offset : chunk.offset + len(chunk) + 1]
            h.update(memoryview(chunk.buffers()[2])[int(offsets[0]) : int(offsets[-1])])


def _digest(spec: TransformSpec, values: Iterator[Any]) -> str:
    h = hashlib.sha256(json.dumps(spec.as_dict(), sort_keys=True).encode())
    h.update("".join(f"{i}|{size}|{mtime}|{label}\n" for i, size, mtime, label in values).encode())
    return h.hexdigest()


def version_key(plan: pa.Table, spec: TransformSpec) -> str:
    """The content key of a shard plan: a digest of the transform and every row's shard, id, size, mtime and
    label in plan order (never of time or attempt). Its shards go under ``v/<key>/``: the same plan always
    writes the same names, so a re-run finds what an interrupted one wrote. build_plan computes the same key
    while it writes."""
    h = _key_hash(spec)
    _key_update(h, plan)
    return h.hexdigest()[:16]


def _key_hash(spec: TransformSpec) -> Any:
    return hashlib.sha256(json.dumps(spec.as_dict(), sort_keys=True).encode())


def _key_update(h: Any, plan: pa.Table) -> None:
    """Feed PLAN's rows to the version key H, one chunk of text at a time (a dead row's line says so: a plan that
    marks other rows dead is another version)."""
    columns = ["shard", "id", "size", "mtime", "label"]
    dead = DEAD in plan.column_names
    lines = _lines(plan, columns)
    if lines is not None and not (dead and plan.column(DEAD).null_count):
        if dead:
            lines = pc.if_else(plan.column(DEAD), pc.binary_join_element_wise(lines, "dead", "|"), lines)
        _feed(h, pc.binary_join_element_wise(lines, "", "\n"))
        return
    for batch in plan.select([*columns, DEAD] if dead else columns).to_batches(max_chunksize=65_536):
        values = [batch.column(c).to_pylist() for c in columns]
        flags = batch.column(DEAD).to_pylist() if dead else [False] * batch.num_rows
        lines = zip(*values, flags, strict=True)
        h.update("".join(f"{s}|{i}|{z}|{m}|{lab}{'|dead' if d else ''}\n" for s, i, z, m, lab, d in lines).encode())
