"""Verification of a published shard dataset: every object manifest.json names is there, every shard sha256-equal.

Shards are hashed by a small pool of threads, each streaming one shard in 1 MiB chunks (at most ``workers`` shards
in flight, so memory stays at a few chunks whatever the shard size); the .idx and .info.json sidecars and the
samples and shards tables are checked for presence. A shard kept by a refresh with dead samples (see ``replan``) is
checked against its first version's sha256 (its tar is never rewritten) and its new index must list exactly its live
samples: as many as the entry says, none of its dead keys (read from the shards table). At ImageNet's count this is
a few hundred shards: every byte is re-read and hashed by default, the cost of an honest check after an ingest. A
refresh's check (``hash_kept=False``) hashes what its version wrote (the shards under its own ``v/<key>/``) and
checks each kept shard, hashed by the version that wrote it, for presence and size: its cost follows the change;
`imgest verify` re-hashes everything.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from imgest.core.errors import ImgestError
from imgest.sinks.shards.shard_table import ShardTableError, dead_count, dead_keys
from imgest.sinks.shards.store import ShardStore
from imgest.sinks.shards.store_names import shard_object, shard_objects, tables_objects
from imgest.sinks.shards.tar_writer import index_key

log = logging.getLogger(__name__)
DEFAULT_WORKERS = 8  # shards hashed at once (one S3 GET stream or file each); below boto3's 10 pooled connections


class ShardVerificationError(ImgestError):
    """A published shard is missing or its bytes differ from manifest.json."""


@dataclass
class ShardVerifyReport:
    location: str
    shards: int = 0
    samples: int = 0
    bytes: int = 0
    hashed_bytes: int = 0
    kept_unhashed: int = 0  # kept shards checked for presence and size only (hash_kept=False)
    workers: int = DEFAULT_WORKERS
    mismatches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.shards > 0 and not self.mismatches

    def to_dict(self) -> dict[str, Any]:
        return {
            "location": self.location,
            "ok": self.ok,
            "shards": self.shards,
            "samples": self.samples,
            "bytes": self.bytes,
            "hashed_bytes": self.hashed_bytes,
            "kept_unhashed": self.kept_unhashed,
            "workers": self.workers,
            "mismatches": self.mismatches,
        }


def shard_problem(
    store: ShardStore, entry: dict[str, Any], dead: frozenset[str] = frozenset()
) -> tuple[str | None, int]:
    """(what is wrong with manifest ENTRY's objects or None, bytes hashed): the tar streamed and hashed, its
    size and sha256 compared with the entry; its sidecars present; its index without its DEAD keys."""
    path = shard_object(entry)
    chunks = store.read_chunks(path)
    if chunks is None:
        return f"{path}: missing", 0
    h, size = hashlib.sha256(), 0
    for chunk in chunks:
        h.update(chunk)
        size += len(chunk)
    if size != entry["bytes"]:
        return f"{path}: {size} bytes, manifest.json says {entry['bytes']}", size
    if h.hexdigest() != entry["sha256"]:
        return f"{path}: sha256 differs", size
    absent = [name for name in shard_objects(entry)[1:] if store.size(name) is None]
    if absent:
        return f"{path}: missing {', '.join(absent)}", size
    return (index_problem(store, entry, dead) if dead_count(entry) else None), size


def kept_problem(store: ShardStore, entry: dict[str, Any], dead: frozenset[str] = frozenset()) -> str | None:
    """What is wrong with the objects of ENTRY, a shard kept from the version that hashed it, or None: the tar of its
    size (no byte read), its sidecars present, its index listing its live samples (none of its DEAD keys)."""
    path = shard_object(entry)
    size = store.size(path)
    if size is None:
        return f"{path}: missing"
    if size != entry["bytes"]:
        return f"{path}: {size} bytes, manifest.json says {entry['bytes']}"
    absent = [name for name in shard_objects(entry)[1:] if store.size(name) is None]
    if absent:
        return f"{path}: missing {', '.join(absent)}"
    return index_problem(store, entry, dead) if dead_count(entry) else None


def index_problem(store: ShardStore, entry: dict[str, Any], dead: frozenset[str]) -> str | None:
    """What is wrong with the index of ENTRY, a shard with dead samples (DEAD, from the shards table), or None: it
    must list exactly the entry's live sample count, none of them a dead key."""
    name = str(entry["index"])
    lines = (store.read_bytes(name) or b"").decode().splitlines()
    head = lines[0].split() if lines else []
    if len(head) != 2 or head[1] != str(len(lines) - 1) or len(lines) - 1 != entry["samples"]:
        listed = max(len(lines) - 1, 0)
        return f"{name}: lists {listed} samples (header {' '.join(head)!r}), manifest.json says {entry['samples']}"
    if len(dead) != dead_count(entry):
        return f"{name}: the shards table lists {len(dead)} dead samples, manifest.json says {dead_count(entry)}"
    listed = [index_key(line) for line in lines[1:] if index_key(line) in dead]
    return f"{name}: lists dead samples {', '.join(listed[:3])}" if listed else None


def _bounded(
    pool: ThreadPoolExecutor,
    check: Callable[[dict[str, Any]], tuple[str | None, int]],
    entries: list[dict[str, Any]],
    limit: int,
) -> Iterator[tuple[str | None, int]]:
    """CHECK of every entry, at most LIMIT in flight, in completion order."""
    pending: set[Future[tuple[str | None, int]]] = set()
    for entry in entries:
        if len(pending) >= limit:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            yield from (f.result() for f in done)
        pending.add(pool.submit(check, entry))
    for future in pending:
        yield future.result()


@dataclass(frozen=True)
class VerifyPlan:
    """What checking a published version's shards needs besides the store: the version's own prefix (``v/<key>/``),
    whether shards kept from earlier versions are hashed, and the dead keys of its marked shards (by shard name).
    Small enough to ship inside Spark tasks (imgest.spark.shard_verify), each with its part of DEAD."""

    own: str
    hash_kept: bool = True
    dead: dict[str, frozenset[str]] = field(default_factory=dict)

    def part(self, entries: list[dict[str, Any]]) -> VerifyPlan:
        """This plan with the dead keys of ENTRIES' shards only."""
        names = {e["name"] for e in entries}
        return VerifyPlan(self.own, self.hash_kept, {k: v for k, v in self.dead.items() if k in names})


def plan_verify(store: ShardStore, hash_kept: bool = True) -> tuple[dict[str, Any], VerifyPlan, ShardVerifyReport]:
    """The published manifest, the plan of its check and the report with its counts (no shard read yet)."""
    manifest = store.read_manifest()
    if manifest is None:
        raise ShardVerificationError(f"no manifest.json at {store.location}: the dataset is not published")
    own = f"v/{manifest.get('key')}/"
    report = ShardVerifyReport(store.location)
    for entry in manifest["shards"]:
        report.shards += 1
        report.samples += entry["samples"]
        report.bytes += entry["bytes"]
        if not hash_kept and not shard_object(entry).startswith(own):
            report.kept_unhashed += 1
    try:
        dead = dead_keys(store, manifest)  # the dead column of the marked shards' rows only
    except ShardTableError:  # reported by finish_verify as a missing table; each marked shard's index as unchecked
        dead = {}
    return manifest, VerifyPlan(own, hash_kept, dead), report


def check_entry(store: ShardStore, plan: VerifyPlan, entry: dict[str, Any]) -> tuple[str | None, int]:
    """(what is wrong with ENTRY's objects or None, bytes hashed), hashed or checked for size as PLAN says."""
    keys = plan.dead.get(entry["name"], frozenset())
    if plan.hash_kept or shard_object(entry).startswith(plan.own):
        return shard_problem(store, entry, keys)
    return kept_problem(store, entry, keys), 0


def check_entries(
    store: ShardStore, plan: VerifyPlan, entries: list[dict[str, Any]], workers: int = DEFAULT_WORKERS
) -> list[tuple[str | None, int]]:
    """check_entry of every one of ENTRIES, WORKERS at once (memory: a few chunks each, whatever the shard size)."""
    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="imgest-verify") as pool:
        return list(_bounded(pool, lambda e: check_entry(store, plan, e), entries, max(1, workers)))


def finish_verify(
    store: ShardStore, manifest: dict[str, Any], report: ShardVerifyReport, results: list[tuple[str | None, int]]
) -> ShardVerifyReport:
    """REPORT with the RESULTS of every shard's check and the samples and shards tables checked for presence."""
    for problem, hashed in results:
        report.hashed_bytes += hashed
        if problem:
            report.mismatches.append(problem)
    for table in tables_objects(manifest):
        if store.size(table) is None:
            report.mismatches.append(f"{table}: missing")
    report.mismatches.sort()
    log.info("verified %d shards (%d bytes hashed) at %s", report.shards, report.hashed_bytes, store.location)
    return report


def verify_shards(store: ShardStore, workers: int = DEFAULT_WORKERS, hash_kept: bool = True) -> ShardVerifyReport:
    """Check every shard listed in manifest.json: present, of its size, sha256-equal (WORKERS hashed at once),
    with its sidecars; and the samples and shards tables present. Memory stays flat (chunks, bounded in flight).
    HASH_KEPT False: a shard outside the version's own folder (kept from an earlier version, which hashed it) is checked
    for presence and size, its sidecars and index as any other. In this process; on Spark's executors:
    imgest.spark.shard_verify."""
    manifest, plan, report = plan_verify(store, hash_kept)
    report.workers = max(1, workers)
    return finish_verify(store, manifest, report, check_entries(store, plan, manifest["shards"], workers))
