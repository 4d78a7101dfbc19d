"""Verification of a published shard dataset: every object manifest.json names is there, every shard sha256-equal.

Shards are hashed by a small pool of threads, each streaming one shard in 1 MiB chunks (at most ``workers``
shards in flight, so memory stays at a few chunks whatever the shard size); the .idx and .info.json sidecars
and the samples table are checked for presence. At ImageNet's count this is a few hundred shards: every byte
is re-read and hashed by default, the cost of an honest check after an ingest.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from imgest.core.errors import ImgestError
from imgest.sinks.shards.store import ShardStore, samples_object, shard_object, shard_objects

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
            "workers": self.workers,
            "mismatches": self.mismatches,
        }


def shard_problem(store: ShardStore, entry: dict[str, Any]) -> tuple[str | None, int]:
    """(what is wrong with manifest ENTRY's objects or None, bytes hashed): the tar streamed and hashed, its
    size and sha256 compared with the entry; its sidecars present."""
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
    return (f"{path}: missing {', '.join(absent)}" if absent else None), size


def _bounded(
    pool: ThreadPoolExecutor, store: ShardStore, entries: list[dict[str, Any]], limit: int
) -> Iterator[tuple[str | None, int]]:
    """shard_problem of every entry, at most LIMIT in flight, in completion order."""
    pending: set[Future[tuple[str | None, int]]] = set()
    for entry in entries:
        if len(pending) >= limit:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            yield from (f.result() for f in done)
        pending.add(pool.submit(shard_problem, store, entry))
    for future in pending:
        yield future.result()


def verify_shards(store: ShardStore, workers: int = DEFAULT_WORKERS) -> ShardVerifyReport:
    """Check every shard listed in manifest.json: present, of its size, sha256-equal (WORKERS hashed at once),
    with its sidecars; and the samples table present. Memory stays flat (chunks, bounded in flight)."""
    manifest = store.read_manifest()
    if manifest is None:
        raise ShardVerificationError(f"no manifest.json at {store.location}: the dataset is not published")
    workers = max(1, workers)
    report = ShardVerifyReport(store.location, workers=workers)
    entries = manifest["shards"]
    for entry in entries:
        report.shards += 1
        report.samples += entry["samples"]
        report.bytes += entry["bytes"]
    with ThreadPoolExecutor(workers, thread_name_prefix="imgest-verify") as pool:
        for problem, hashed in _bounded(pool, store, entries, workers):
            report.hashed_bytes += hashed
            if problem:
                report.mismatches.append(problem)
    if store.size(samples_object(manifest)) is None:
        report.mismatches.append(f"{samples_object(manifest)}: missing")
    report.mismatches.sort()
    log.info("verified %d shards (%d bytes hashed) at %s", report.shards, report.hashed_bytes, store.location)
    return report
