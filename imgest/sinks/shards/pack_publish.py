"""Publishing packed shards: the manifest, samples.parquet (every live sample's shard and position), shards.parquet
(each shard's labels, quarantine and dead keys), and the atomic switch that makes a version live by writing
manifest.json; and what a run takes of the live version: each shard's entry, to travel with that shard's task."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from imgest.core import workdir
from imgest.core.errors import ImgestError
from imgest.core.locks import check_fence
from imgest.core.quarantine import QuarantineLog, quarantine_summary
from imgest.sinks.shards.pack_record import PUBLISHED_FIELDS, PackConfig, Published, ShardRecord
from imgest.sinks.shards.plan import DEAD
from imgest.sinks.shards.shard_table import DEAD_COUNT, DETAIL, TABLE_KEY, dead_count, iter_details, table_name
from imgest.sinks.shards.store import ShardStore, manifest_bytes
from imgest.sinks.shards.store_names import history_name, samples_object, version_prefix
from imgest.sources.manifest import ClassInfo

log = logging.getLogger(__name__)


def build_manifest(
    records: list[ShardRecord], cfg: PackConfig, classes: list[ClassInfo], scan_quarantine: QuarantineLog
) -> dict[str, Any]:
    """manifest.json: shards (each named by its objects relative to the destination, with its counts), class map,
    quarantine summary, settings, the plan's key, its samples table and its shards table (each shard's labels,
    quarantine and dead keys: shard_table.shards_table of the same RECORDS); no timestamps: re-runs match."""
    records = sorted(records, key=lambda r: r.name)
    quarantine = [q for r in records for q in r.quarantine] + [
        {**asdict(e), "reason": str(e.reason)} for e in scan_quarantine.entries
    ]
    per_split: Counter[str] = Counter()
    for r in records:
        per_split[r.split] += r.samples
    return {
        "format": "webdataset",
        "dataset": cfg.dataset,
        "members": ["jpg|<ext> (image)", "cls (label, ASCII)", "json (id, label, wnid, split, source, size)"],
        "shards": [
            {
                "name": r.name,
                "path": r.path,
                "split": r.split,
                "samples": r.samples,
                "bytes": r.bytes,
                "sha256": r.sha256,
                "index": r.index,
                "info": r.info,
                "digest": r.digest,
                "quarantined": len(r.quarantine),
                **({DEAD_COUNT: len(r.dead)} if r.dead else {}),
            }
            for r in records
        ],
        "samples": dict(sorted(per_split.items())),
        "bytes": sum(r.bytes for r in records),
        "classes": [asdict(c) for c in classes],
        "quarantine": quarantine_summary(quarantine),
        "transform": cfg.spec.as_dict(),
        "sharding": asdict(cfg.shards),
        "key": cfg.key,
        "samples_table": f"{cfg.prefix()}/{workdir.PUBLISHED_SAMPLES}",
        TABLE_KEY: table_name(cfg.prefix()),
    }


SAMPLES_GROUP_ROWS = 65_536  # rows per row group of samples.parquet


def samples_table(plan: Any, records: list[ShardRecord]) -> bytes:
    """samples.parquet: id, label, split, shard and position in its tar of every live packed sample (quarantined
    samples and a refresh's dead rows are left out). PLAN, in shard order, is a table or the path of a plan file; a
    file is read a row group at a time, so memory holds one group and the compressed output, whatever the dataset's
    size."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = ["id", "label", "split", "shard"]
    if isinstance(plan, pa.Table):
        base = plan.schema
        pieces: Iterable[Any] = (pa.Table.from_batches([b]) for b in plan.to_batches(max_chunksize=SAMPLES_GROUP_ROWS))
    else:
        source = pq.ParquetFile(plan)
        base = source.schema_arrow
        read = [*columns, DEAD] if DEAD in base.names else columns
        pieces = (source.read_row_group(g, columns=read) for g in range(source.num_row_groups))
    schema = pa.schema([base.field(c) for c in columns] + [pa.field("position", pa.int32())], metadata=base.metadata)
    absent = _pairs((r.name, q["id"]) for r in records for q in r.quarantine)  # live rows not in their tar
    dead = _pairs((r.name, key) for r in records for key in r.dead)  # dead rows still in their tar
    buf = io.BytesIO()
    with pq.ParquetWriter(buf, schema, compression="zstd") as writer:
        pending: list[Any] = []
        for table in _positioned(pieces, columns, absent, dead):
            pending.append(table.cast(schema))
            if sum(t.num_rows for t in pending) >= SAMPLES_GROUP_ROWS:
                writer.write_table(pa.concat_tables(pending))
                pending = []
        if pending:
            writer.write_table(pa.concat_tables(pending))
    return buf.getvalue()


def _pairs(pairs: Iterable[tuple[str, str]]) -> Any:
    """(shard, id) PAIRS as an Arrow array of ``shard/id`` strings (the keys _in_tar looks rows up by)."""
    import pyarrow as pa

    return pa.array(sorted({f"{shard}/{key}" for shard, key in pairs}), pa.string())


def _in_tar(piece: Any, absent: Any, dead: Any) -> Any:
    """Which rows of PIECE have a sample in their shard's tar: a live row unless its shard's record quarantined it
    (ABSENT), a dead row only where its shard's record lists it among the tar's dead keys (DEAD: a row quarantined
    when the tar was written, or a shard whose live rows were rewritten, has none)."""
    import pyarrow.compute as pc

    keys = pc.binary_join_element_wise(piece.column("shard"), piece.column("id"), "/")
    live = pc.invert(pc.is_in(keys, value_set=absent))
    if DEAD not in piece.column_names:
        return live
    return pc.if_else(piece.column(DEAD), pc.is_in(keys, value_set=dead), live)


def _positioned(pieces: Iterable[Any], columns: list[str], absent: Any, dead: Any) -> Iterable[Any]:
    """The live rows of every piece of a plan with their position in their shard's tar (counted on across pieces;
    a dead row still in the tar holds its place there). Whether a row is in the tar is asked per shard: after a
    refresh one id can be dead in a kept shard and live, or quarantined, in a new one."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    last, count = None, 0
    for piece in pieces:
        kept = piece.filter(_in_tar(piece, absent, dead))
        kept = kept.select([*columns, DEAD] if DEAD in kept.column_names else columns)
        if not kept.num_rows:
            continue
        codes = pc.dictionary_encode(kept.column("shard")).combine_chunks().indices.to_numpy()
        rows = np.arange(len(codes))
        starts = np.maximum.accumulate(np.where(np.r_[True, codes[1:] != codes[:-1]], rows, 0))
        position = rows - starts
        if kept.column("shard")[0].as_py() == last:  # the shard goes on from the previous piece
            position[starts == 0] += count
        last, count = kept.column("shard")[-1].as_py(), int(position[-1]) + 1
        kept = kept.append_column("position", pa.array(position, pa.int32()))
        if DEAD in kept.column_names:
            kept = kept.filter(pc.invert(kept.column(DEAD))).drop_columns([DEAD])
        if kept.num_rows:
            yield kept


def publish(
    store: ShardStore, manifest: dict[str, Any], samples: bytes | None = None, shards: bytes | None = None
) -> bool:
    """Make MANIFEST the live dataset: write its samples and shards tables (SAMPLES, SHARDS: under its version
    prefix), keep a copy of it as
    ``manifests/<key>.json``, then write ``manifest.json``: that one write is the switch. Nothing is copied or
    deleted; the previous manifest and its objects stay readable until the switch (and after it, until
    ``imgest gc shards`` collects them). Sets MANIFEST's ``previous`` to the key of the manifest it replaces.

    Returns False, writing nothing, when the live manifest is already MANIFEST. Right before the switch, a
    process that holds the dataset's lock proves it still does (LockLostError, nothing switched, otherwise); the
    switch itself lands only over the manifest read here (``manifest_switch``: ManifestConflictError otherwise).
    """
    from imgest.sinks.shards.manifest_switch import read_live, switch

    live, version = read_live(store)
    key = manifest["key"]
    if live is None:
        manifest["previous"] = None
    else:
        manifest["previous"] = live.get("previous") if live.get("key") == key else live.get("key")
    if live == manifest:
        return False
    if samples is not None:
        store.put_bytes(samples_object(manifest), samples)
    if shards is not None:
        store.put_bytes(str(manifest[TABLE_KEY]), shards)
    store.put_bytes(history_name(key), manifest_bytes(manifest))
    check_fence(str(manifest.get("dataset", "")))
    switch(store, manifest, version)
    log.info("published %s: %d shards under %s", store.location, len(manifest["shards"]), version_prefix(key))
    return True


def published_entries(live: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """name -> what a task needs of each shard the LIVE manifest lists (PUBLISHED_FIELDS; empty when none is live).
    A manifest written before shards.parquet holds the detail in its entries: it is left out here too."""
    entries = {}
    for entry in (live or {}).get("shards", []):
        if "digest" in entry:
            slim = {k: entry[k] for k in PUBLISHED_FIELDS if k in entry}
            if dead_count(entry):
                slim[DEAD_COUNT] = dead_count(entry)
            entries[entry["name"]] = slim
    return entries


def marked_shards(plan: Any) -> set[str]:
    """The shards of the plan file PLAN (one row group a shard) with a dead row: a refresh's kept shards that lose
    samples. Read from the row groups' statistics where written, else the dead column; none in a plan without it."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    source = pq.ParquetFile(plan)
    if DEAD not in source.schema_arrow.names:
        return set()
    at = source.schema_arrow.names.index(DEAD)
    marked = set()
    for group in range(source.num_row_groups):
        stats = source.metadata.row_group(group).column(at).statistics
        if stats is not None and stats.has_min_max and not stats.max:
            continue
        part = source.read_row_group(group, columns=["shard", DEAD])
        marked.update(pc.unique(part.filter(pc.fill_null(part.column(DEAD), False)).column("shard")).to_pylist())
    return marked


def plan_items(
    shards: Iterable[tuple[str, int]], live: dict[str, Any] | None, store: ShardStore, marked: set[str]
) -> list[tuple[str, int, Published]]:
    """(name, row group, live entry or None) for SHARDS ((name, row group) of the plan): what each shard's task gets
    of the LIVE manifest. The shards a refresh MARKED (marked_shards) also get their labels, quarantine and dead keys,
    read from the live shards table; the others get PUBLISHED_FIELDS only (their detail is carried by the driver)."""
    entries = published_entries(live)
    detailed = marked & set(entries)
    if detailed and live is not None:
        for row in iter_details(store, live, DETAIL, detailed):
            entries[row["name"]].update({c: row[c] for c in DETAIL})
    return [(name, group, entries.get(name)) for name, group in shards]


def carry_published(records: list[ShardRecord], live: dict[str, Any] | None, store: ShardStore) -> None:
    """Fill in the labels, quarantine and dead keys of the RECORDS kept as LIVE published them (``carried``), from
    the live shards table, a group of shards at a time."""
    carried = {r.name: r for r in records if r.carried}
    if not carried:
        return
    if live is None:
        raise ImgestError(f"{len(carried)} shards kept as published, but no manifest is live at {store.location}")
    for row in iter_details(store, live, DETAIL, set(carried)):
        record = carried.pop(row["name"])
        record.labels, record.quarantine, record.dead = row["labels"], row["quarantine"], row["dead"]
        record.carried = False
    if carried:
        raise ImgestError(f"{store.location}: the live shards table has no row for {', '.join(sorted(carried)[:3])}")
