"""The per-shard detail of a published shard dataset: each shard's samples per label, quarantined inputs and dead
keys, one Parquet row a shard beside samples.parquet (``v/<key>/shards.parquet``), read a group of shards at a time.

manifest.json keeps what every reader needs of a shard (name, path, index, counts, sha256, digest, bytes, and
``dead_samples``, how many of its tar's samples a refresh took out) and names this table (``shards_table``), so its
size follows the number of shards, not shards x classes. A manifest written before the table existed keeps these
fields in its entries; every function here reads them from there.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from imgest.core import workdir
from imgest.core.errors import ImgestError

DETAIL = ("labels", "quarantine", "dead")  # the columns beside the shard's name
GROUP_SHARDS = 64  # shards per row group: a reader decodes this many shards' detail at a time
TABLE_KEY = "shards_table"  # manifest.json's field naming the table (relative to the destination)
DEAD_COUNT = "dead_samples"  # a manifest entry's count of dead keys (present when there are some)


class ShardTableError(ImgestError):
    """The per-shard table a manifest names is missing."""


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("name", pa.string()),
            ("labels", pa.map_(pa.string(), pa.int64())),
            ("quarantine", pa.list_(pa.string())),  # each entry as sorted-key JSON (path, split, reason, detail, id)
            ("dead", pa.list_(pa.string())),
        ]
    )


def table_name(prefix: str) -> str:
    """The table of the version whose objects are under PREFIX (``v/<key>``)."""
    return f"{prefix}/{workdir.PUBLISHED_SHARDS}"


def shards_table(records: Iterable[Any]) -> bytes:
    """shards.parquet of RECORDS (ShardRecords, or anything with name, labels, quarantine and dead), sorted by
    name, GROUP_SHARDS shards a row group (deterministic: same records, same bytes)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _schema()
    buf = io.BytesIO()
    with pq.ParquetWriter(buf, schema, compression="zstd") as writer:
        group: list[dict[str, Any]] = []
        for r in sorted(records, key=lambda r: r.name):
            group.append(
                {
                    "name": r.name,
                    "labels": sorted(r.labels.items()),
                    "quarantine": [json.dumps(q, sort_keys=True) for q in r.quarantine],
                    "dead": list(r.dead),
                }
            )
            if len(group) == GROUP_SHARDS:
                writer.write_table(pa.Table.from_pylist(group, schema))
                group = []
        if group or not buf.tell():
            writer.write_table(pa.Table.from_pylist(group, schema))
    return buf.getvalue()


@contextmanager
def _opened(store: Any, name: str) -> Iterator[Any]:
    """The Parquet object NAME of STORE, opened for reading a row group at a time: a folder's file in place, an
    S3 object streamed to a temporary file first (memory holds a chunk, not the object)."""
    import pyarrow.parquet as pq

    root = getattr(store, "root", None)
    if isinstance(root, Path):
        if not (root / name).is_file():
            raise ShardTableError(f"{store.location}: {name} is missing; run `imgest verify` on the dataset")
        yield pq.ParquetFile(root / name)
        return
    chunks = store.read_chunks(name)
    if chunks is None:
        raise ShardTableError(f"{store.location}: {name} is missing; run `imgest verify` on the dataset")
    with tempfile.TemporaryFile(prefix="imgest-shards-") as fh:
        for chunk in chunks:
            fh.write(chunk)
        fh.seek(0)
        yield pq.ParquetFile(fh)


def _decoded(row: dict[str, Any]) -> dict[str, Any]:
    """A table row as the fields of an old manifest entry: labels a dict, quarantine entries dicts."""
    out = dict(row)
    if "labels" in out:
        out["labels"] = dict(out["labels"] or [])
    if "quarantine" in out:
        out["quarantine"] = [json.loads(q) for q in out["quarantine"] or []]
    if "dead" in out:
        out["dead"] = list(out["dead"] or [])
    return out


def iter_details(
    store: Any, manifest: dict[str, Any], columns: Collection[str] = DETAIL, names: Collection[str] | None = None
) -> Iterator[dict[str, Any]]:
    """``{"name": ..., <COLUMNS>}`` of every shard of MANIFEST (of NAMES only, when given), in name order, read
    from its shards table a row group at a time (or from the entries of a manifest written before the table)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    wanted = [c for c in DETAIL if c in columns]
    table = manifest.get(TABLE_KEY)
    if not table:  # an older manifest: the detail is in its entries
        for entry in sorted(manifest.get("shards", []), key=lambda e: e["name"]):
            if names is None or entry["name"] in names:
                old = {"labels": dict(entry.get("labels") or {}), "quarantine": list(entry.get("quarantine") or [])}
                old["dead"] = list(entry.get("dead") or [])
                yield {"name": entry["name"], **{c: old[c] for c in wanted}}
        return
    only = None if names is None else pa.array(sorted(names), pa.string())
    with _opened(store, str(table)) as source:
        for group in range(source.num_row_groups):
            part = source.read_row_group(group, columns=["name", *wanted])
            if only is not None:
                part = part.filter(pc.is_in(part.column("name"), value_set=only))
            yield from (_decoded(row) for row in part.to_pylist())


def dead_count(entry: dict[str, Any]) -> int:
    """How many of the tar's samples manifest ENTRY says are dead (either format)."""
    return int(entry.get(DEAD_COUNT) or len(entry.get("dead") or ()))


def dead_keys(store: Any, manifest: dict[str, Any], names: Collection[str] | None = None) -> dict[str, frozenset[str]]:
    """shard name -> its dead keys, for the shards of MANIFEST (of NAMES) that a refresh kept with some samples
    taken out; only the dead column of the table is read, and none when no entry has dead samples."""
    marked = {e["name"] for e in manifest.get("shards", []) if dead_count(e) and (names is None or e["name"] in names)}
    if not marked:
        return {}
    return {row["name"]: frozenset(row["dead"]) for row in iter_details(store, manifest, ["dead"], marked)}
