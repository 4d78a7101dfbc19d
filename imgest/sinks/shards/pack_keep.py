"""Keeping a published shard whose plan marks some of its samples dead (a refresh's deletions): a new DALI index of
its live samples, no byte of the tar rewritten."""

from __future__ import annotations

import logging
from typing import Any

from imgest.core import workdir
from imgest.core.errors import ConfigError
from imgest.sinks.shards.pack_record import PackConfig, Published, ShardRecord
from imgest.sinks.shards.plan import DEAD
from imgest.sinks.shards.plan_digest import shard_table_digest
from imgest.sinks.shards.store import ShardStore
from imgest.sinks.shards.store_names import shard_object
from imgest.sinks.shards.tar_writer import INDEX_VERSION, index_key

log = logging.getLogger(__name__)


def kept_with_deletions(
    name: str, rows: Any, cfg: PackConfig, store: ShardStore, live: Published
) -> ShardRecord | None:
    """The record of shard NAME kept as published with the dead ROWS taken out, or None when LIVE (its live entry
    with its labels, quarantine and dead keys) is no tar of NAME with the same inputs (every row, dead or live, in
    its order). No byte of the tar is rewritten: its live samples are listed in a new DALI index
    ``v/<key>/NAME.idx`` (never the published index's name), its dead keys in the record. A shard with no new dead
    sample keeps its published entry: its index is neither read nor written, so a refresh costs nothing for the
    shards an earlier one marked."""
    import pyarrow as pa
    import pyarrow.compute as pc

    digest = shard_table_digest(rows, cfg.spec)
    if live is None or live.get("digest") != digest or store.size(shard_object(live)) != live["bytes"]:
        return None
    _require_detail(name, live)
    flags = pc.fill_null(rows.column(DEAD), False)
    dead = {str(i) for i in pc.filter(rows.column("id"), flags).to_pylist()}
    record = ShardRecord(
        name,
        str(rows.column("split")[0].as_py()),
        live["samples"],
        live["bytes"],
        live["sha256"],
        digest,
        shard_object(live),
        str(live["index"]),
        live.get("info") or workdir.shard_info(shard_object(live)),
        reused="published",
        labels=live.get("labels", {}),
        quarantine=[q for q in live.get("quarantine", []) if q.get("id") not in dead],
        dead=list(live.get("dead", [])),
    )
    if not dead - set(record.dead):  # no new dead sample: the published entry stays right, nothing is read
        return record
    raw = store.read_bytes(record.index)
    if raw is None:
        log.warning("shard %s: its index %s is missing", name, record.index)
        return None
    cut = _index_lines(raw, dead - set(record.dead), record.index)  # the samples dead since, found by key
    if not cut:  # the new dead rows were never in the tar (quarantined)
        return record
    header, _, body = raw.partition(b"\n")
    pieces, at = [], 0
    for start, end in sorted(cut.values()):
        pieces.append(body[at:start])
        at = end
    pieces.append(body[at:])
    record.samples = int(header.split()[1]) - len(cut)
    record.index = workdir.shard_index(f"{cfg.prefix()}/{name}")
    store.put_bytes(record.index, b"".join([f"{INDEX_VERSION} {record.samples}\n".encode(), *pieces]))
    dead_keys = sorted(set(record.dead) | set(cut))
    record.dead = dead_keys
    absent = pa.array(sorted({str(q.get("id")) for q in record.quarantine}), pa.string())  # live, never in the tar
    counted = pc.and_(pc.invert(flags), pc.invert(pc.is_in(rows.column("id"), value_set=absent)))
    counts = pc.value_counts(pc.filter(rows.column("label"), counted)).to_pylist()
    record.labels = {str(c["values"]): int(c["counts"]) for c in counts}
    log.info("shard %s: kept as %s, %d samples dead, indexed by %s", name, record.path, len(dead_keys), record.index)
    return record


def _require_detail(name: str, live: dict[str, Any]) -> None:
    """Refuse to keep shard NAME with deletions when its LIVE entry came without its detail (plan_items adds it)."""
    if "dead" not in live:
        raise ConfigError(
            f"shard {name}: its live entry came without its labels, quarantine and dead keys; "
            "pass the plan's shards through pack_publish.plan_items"
        )


def _index_lines(raw: bytes, keys: set[str], where: str) -> dict[str, tuple[int, int]]:
    """key -> (start, end) of its sample line in the body of DALI index RAW (the object WHERE; after the header line),
    for each of KEYS listed there. A key is found by its member names (`` <key>.``: keys are ids without dots or
    spaces), so only the lines of KEYS are looked at, not the index's thousands of others."""
    body = raw.partition(b"\n")[2]
    found = {}
    for key in keys:
        at = body.find(f" {key}.".encode())
        if at < 0:
            continue
        start = body.rfind(b"\n", 0, at) + 1
        stop = body.find(b"\n", at)
        stop = len(body) if stop < 0 else stop
        named = index_key(body[start:stop].decode())
        if named != key:
            raise ValueError(f"shard index {where}: the line at byte {start} names {named}, not {key}")
        found[key] = (start, min(stop + 1, len(body)))
    return found
