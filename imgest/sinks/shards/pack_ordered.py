"""Packing in the source's order: a shuffled plan over archives on S3 read forward once, each transformed sample
moved to its shard by Spark's shuffle (a two-pass pack, as tarp and webdataset's own tools do).

A shard's planned rows lie all over the source (the plan shuffles), so packing shard by shard from a tar on S3
costs one ranged GET per image. Here the rows to write are sorted by where they lie in the source; each task reads
a stretch of the archive forward (coalesced blocks, imgest.sources.s3objects) and transforms it; Spark moves every
sample, keyed by (shard, place in the shard), to its shard's partition, sorted; that partition writes the shard
as pack_shard does. The tar depends only on its samples and their order, so the shards are the same bytes either
way (tested). Shards kept as published or already written by an interrupted run are settled first and read
nothing (settle_planned).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

from imgest.core.quarantine import QuarantineEntry, QuarantineLog
from imgest.core.staging import Staged
from imgest.sinks.shards.pack import (
    CANDIDATE_FIELDS,
    KEEP_COLUMNS,
    Sample,
    candidate,
    keep_published,
    settle_shard,
    store_shard,
)
from imgest.sinks.shards.pack_record import PackConfig, Published, ShardRecord
from imgest.sinks.shards.plan import DEAD, read_shard_table
from imgest.sinks.shards.store import ShardStore
from imgest.sources.s3source import is_s3
from imgest.transform.pipeline import process_candidates

READ_ORDERS = ("auto", "plan", "source")
SOURCE_ROWS_PER_TASK = 8_192  # rows of the source each task of the first pass reads forward
SourceKey = tuple[str, int, str]  # (archive, offset, path): where a row lies in the source
Place = tuple[int, int]  # (shard ordinal among the shards written, position in the shard)


@dataclass(frozen=True)
class Pending:
    """A shard whose samples must be written: its plan row group, and the digest and split of the rows it writes."""

    name: str
    group: int
    digest: str
    split: str


def source_order(choice: str, root: str, layout: str) -> bool:
    """Whether to pack in the source's order: CHOICE "source" or "plan", or "auto": yes for archives (LAYOUT tar)
    on S3, where the plan's order costs a GET per image; a folder source costs one GET (or open) per image either
    way and a local archive is read by seeks."""
    if choice not in READ_ORDERS:
        raise ValueError(f"read order {choice!r}: expected one of {', '.join(READ_ORDERS)}")
    return choice == "source" or (choice == "auto" and layout == "tar" and is_s3(root))


def _open(plan: Path | Staged) -> Any:
    import pyarrow.parquet as pq

    return plan.parquet() if isinstance(plan, Staged) else pq.ParquetFile(plan)


def settle_planned(
    plan: Path | Staged,
    shards: Iterable[tuple[str, int, Published]],
    cfg: PackConfig,
    store_factory: Callable[[], ShardStore],
) -> list[ShardRecord | Pending]:
    """For each of SHARDS ((name, row group of PLAN, live entry)): its record when nothing of it is to be written
    (kept as published, with or without deletions, or resumed), else what pack_in_source_order needs to write it."""
    store, source = store_factory(), _open(plan)
    settled: list[ShardRecord | Pending] = []
    for name, group, live in shards:
        record = keep_published(name, read_shard_table(source, group, KEEP_COLUMNS), cfg, store, live)
        if record is None:
            found = settle_shard(name, read_shard_table(source, group).to_pylist(), cfg, store, live)
            record = found if isinstance(found, ShardRecord) else Pending(name, group, found[1], found[0][0]["split"])
        settled.append(record)
    return settled


def source_rows(plan: Path | Staged, pending: Iterable[tuple[int, Pending]]) -> Iterator[tuple[SourceKey, Any]]:
    """(where in the source, (place, candidate fields)) for every row PENDING's shards write (their live rows, in
    shard order: the positions settle_shard's rows have)."""
    source = _open(plan)
    for ordinal, shard in pending:
        rows = read_shard_table(source, shard.group, [*CANDIDATE_FIELDS, DEAD]).to_pylist()
        live = (r for r in rows if not r.get(DEAD))
        for position, row in enumerate(live):
            key = (row["container"] or "", row["offset"] or 0, row["rel_path"])
            yield key, ((ordinal, position), tuple(row[k] for k in CANDIDATE_FIELDS))


def transform_in_order(
    items: Iterator[tuple[SourceKey, Any]], cfg: PackConfig, on_sample: Callable[[int], None] | None = None
) -> Iterator[tuple[Place, tuple[Any, ...]]]:
    """Each of ITEMS (sorted by where they lie) read and transformed, as (place, ("s", candidate fields, data, ext,
    width, height, sha256 or None)); one that is quarantined as (place, ("q", quarantine entry fields))."""
    places: dict[str, Place] = {}

    def candidates() -> Iterator[Any]:
        for _, (place, fields) in items:
            cand = candidate(dict(zip(CANDIDATE_FIELDS, fields, strict=True)))
            places[cand.id] = place
            yield cand

    quarantine = QuarantineLog()
    keeps_source = cfg.spec.mode == "unchanged"  # stored bytes are the source bytes: hash them once
    for p in process_candidates(candidates(), Path(cfg.root), cfg.spec, quarantine):
        yield from _quarantined(quarantine, places)
        img, fields = p.image, tuple(getattr(p.candidate, k) for k in CANDIDATE_FIELDS)
        sha = p.src_sha256 if keeps_source else None
        yield places.pop(p.candidate.id), ("s", fields, img.data, img.ext, img.width, img.height, sha)
        if on_sample:
            on_sample(len(img.data))
    yield from _quarantined(quarantine, places)


def _quarantined(quarantine: QuarantineLog, places: dict[str, Place]) -> Iterator[tuple[Place, tuple[Any, ...]]]:
    for entry in quarantine.entries:
        yield places.pop(str(entry.id)), ("q", astuple(entry))
    quarantine.entries.clear()


def shard_partition(place: Place) -> int:
    """The partition of a sample in the second pass: its shard's ordinal (one partition per shard)."""
    return place[0]


def write_in_order(
    items: Iterator[tuple[Place, tuple[Any, ...]]],
    pending: list[Pending],
    cfg: PackConfig,
    store_factory: Callable[[], ShardStore],
) -> Iterator[ShardRecord]:
    """Write the shards of ITEMS (sorted by place) with store_shard, as pack_shard writes them."""
    store = store_factory()
    for ordinal, group in itertools.groupby(items, key=lambda item: item[0][0]):
        shard, quarantine = pending[ordinal], QuarantineLog()
        yield store_shard(shard.name, shard.split, shard.digest, _samples(group, quarantine), quarantine, cfg, store)


def _samples(group: Iterable[tuple[Place, tuple[Any, ...]]], quarantine: QuarantineLog) -> Iterator[Sample]:
    for _, payload in group:
        if payload[0] == "q":
            quarantine.add(QuarantineEntry(*payload[1]))
            continue
        _, fields, data, ext, width, height, sha = payload
        yield candidate(dict(zip(CANDIDATE_FIELDS, fields, strict=True))), data, ext, width, height, sha


def pack_in_source_order(
    sc: Any,
    plan: Path | Staged,
    items: list[tuple[str, int, Published]],
    cfg: PackConfig,
    store_factory: Callable[[], ShardStore],
    rows: int,
    on_sample: Callable[[int], None] | None = None,
) -> list[ShardRecord]:
    """The records of every shard of ITEMS (plan_items), the shards to write packed in the source's order: settled
    first (one task per few shards), then two passes with a shuffle between them (module docstring)."""
    slices = max(1, min(len(items), 4 * sc.defaultParallelism))
    settled = sc.parallelize(items, slices).mapPartitions(lambda it: settle_planned(plan, it, cfg, store_factory))
    records: list[ShardRecord] = []
    pending: list[Pending] = []
    for item in settled.collect():
        (pending if isinstance(item, Pending) else records).append(item)
    if not pending:
        return records
    tasks = max(2 * sc.defaultParallelism, math.ceil(rows / SOURCE_ROWS_PER_TASK))
    numbered = list(enumerate(pending))
    located = sc.parallelize(numbered, min(len(numbered), tasks)).mapPartitions(lambda it: source_rows(plan, it))
    transformed = located.sortByKey(True, tasks).mapPartitions(lambda it: transform_in_order(it, cfg, on_sample))
    shuffled = transformed.repartitionAndSortWithinPartitions(len(pending), shard_partition)
    written = shuffled.mapPartitions(lambda it: write_in_order(it, pending, cfg, store_factory)).collect()
    by_name = {r.name: r for r in [*records, *written]}
    return [by_name[name] for name, _, _ in items]
