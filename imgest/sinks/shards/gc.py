"""Collecting superseded shards: delete what neither the live manifest nor the last few published ones name.

A publish never deletes anything (see ``store``), so every plan that was ever published or interrupted leaves
its objects under ``<dest>/v/<key>/``. ``collect`` keeps the objects of the live ``manifest.json`` and of the
KEEP manifests published before it (followed through each manifest's ``previous`` key to its copy in
``<dest>/manifests/<key>.json``), and deletes every other object under ``v/`` and ``_staging/`` (the staging area
of the layout before versioned prefixes), plus the ``manifests/`` copies of versions no longer kept.

Safety: objects younger than ``min_age`` are left alone (a pack job may be writing a version that no manifest
names yet); the live manifest is read again before deleting, and a publish in between stops the collection; shard
tars are deleted before their sidecars, so a later run never finds a tar whose .idx or .info.json is gone.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from imgest.core.errors import ImgestError
from imgest.sinks.shards.store import LOCAL_META, ShardStore, StoredObject
from imgest.sinks.shards.store_names import HISTORY, STAGING, VERSIONS, history_name, manifest_objects

log = logging.getLogger(__name__)
GC_BATCH = 1000  # objects deleted between two proofs of the lock and the live manifest
DEFAULT_KEEP = 1
DEFAULT_MIN_AGE_S = 24 * 3600.0


class GcError(ImgestError):
    """The collector refused to run, or stopped, to keep a published dataset whole."""


@dataclass
class GcReport:
    """What one collection found and did (with ``dry_run``: what it would delete)."""

    location: str
    current: str | None
    kept: list[str] = field(default_factory=list)  # keys of the manifests kept (the current one first)
    referenced: int = 0  # objects the kept manifests name
    deleted: int = 0
    deleted_bytes: int = 0
    by_prefix: dict[str, int] = field(default_factory=dict)  # deleted objects per folder (v/<key>, _staging, ...)
    too_young: int = 0  # unreferenced objects left because they are younger than min_age
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "location": self.location,
            "current": self.current,
            "kept": self.kept,
            "referenced": self.referenced,
            "deleted": self.deleted,
            "deleted_bytes": self.deleted_bytes,
            "by_prefix": self.by_prefix,
            "too_young": self.too_young,
            "dry_run": self.dry_run,
        }


def kept_manifests(store: ShardStore, current: dict[str, Any], keep: int) -> list[dict[str, Any]]:
    """CURRENT and up to KEEP manifests published before it, newest first (a missing copy ends the chain)."""
    kept, seen = [current], {current.get("key")}
    previous = current.get("previous")
    while len(kept) <= keep and previous and previous not in seen:
        raw = store.read_bytes(history_name(previous))
        if raw is None:
            log.warning("%s: no copy of the manifest of %s; older versions are not kept", store.location, previous)
            break
        doc = json.loads(raw)
        kept.append(doc)
        seen.add(previous)
        previous = doc.get("previous")
    return kept


def _folder(name: str) -> str:
    """The folder an object is counted under in the report: v/<key>, _staging or manifests."""
    parts = name.split("/")
    return "/".join(parts[:2]) if parts[0] == VERSIONS and len(parts) > 2 else parts[0]


def _garbage(store: ShardStore, referenced: set[str], kept_keys: set[str]) -> list[StoredObject]:
    """Every object under v/, _staging/ and manifests/ that the kept manifests do not need."""
    found = []
    for under in (VERSIONS, STAGING):
        for obj in store.list_objects(under):
            if obj.name not in referenced and obj.name.removesuffix(LOCAL_META) not in referenced:
                found.append(obj)
    for obj in store.list_objects(HISTORY):
        if obj.name.removeprefix(f"{HISTORY}/").removesuffix(".json") not in kept_keys:
            found.append(obj)
    return found


def _still_current(store: ShardStore, current: dict[str, Any], done: int) -> None:
    """Before each batch of deletions: the lock still held (``check_fence``, when this process holds it) and the
    live manifest still CURRENT; GcError naming how many were deleted otherwise."""
    from imgest.core.locks import check_fence

    check_fence(str(current.get("dataset", "")))
    if store.read_manifest() != current:
        raise GcError(
            f"manifest.json of {store.location} changed while gc ran (a publish?); {done} objects were deleted "
            "before that, none since; run gc again"
        )


def collect(
    store: ShardStore,
    keep: int = DEFAULT_KEEP,
    dry_run: bool = False,
    min_age: float = DEFAULT_MIN_AGE_S,
    now: float | None = None,
) -> GcReport:
    """Delete the objects of STORE that neither the live manifest nor the KEEP before it name (see the module);
    with DRY_RUN, only report them. Never deletes an object the live manifest names."""
    if keep < 0:
        raise GcError(f"--keep {keep}: the number of previous manifests to keep must be 0 or more")
    current = store.read_manifest()
    if current is None:
        raise GcError(
            f"no manifest.json at {store.location}: gc only collects around a published dataset; "
            "publish one first (or delete the prefix yourself if it is abandoned)"
        )
    manifests = kept_manifests(store, current, keep)
    referenced = set().union(*(manifest_objects(m) for m in manifests))
    kept_keys = {str(m["key"]) for m in manifests if m.get("key")}
    report = GcReport(store.location, current.get("key"), [str(m.get("key")) for m in manifests], len(referenced))
    report.dry_run = dry_run
    cutoff = (time.time() if now is None else now) - min_age
    doomed = []
    for obj in _garbage(store, referenced, kept_keys):
        if obj.modified > cutoff:
            report.too_young += 1
        else:
            doomed.append(obj)
    live = manifest_objects(current)
    if any(obj.name in live for obj in doomed):  # cannot happen by construction; refuse rather than trust it
        raise GcError(f"gc of {store.location} chose an object the live manifest names; nothing was deleted")
    report.deleted = len(doomed)
    report.deleted_bytes = sum(obj.size for obj in doomed)
    report.by_prefix = dict(sorted(Counter(_folder(obj.name) for obj in doomed).items()))
    if dry_run or not doomed:
        return report
    tars = [obj.name for obj in doomed if obj.name.endswith(".tar")]  # the tar first: a tar that is there always
    names = tars + [obj.name for obj in doomed if not obj.name.endswith(".tar")]  # has its sidecars
    for at in range(0, len(names), GC_BATCH):
        _still_current(store, current, at)
        store.delete(names[at : at + GC_BATCH])
    log.info(
        "gc of %s: deleted %d objects (%d bytes): %s",
        store.location,
        report.deleted,
        report.deleted_bytes,
        report.by_prefix,
    )
    return report
