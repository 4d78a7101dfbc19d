"""Verification of a published shard dataset: every shard listed in manifest.json is there, sha256-equal."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from imgest.core.errors import ImgestError
from imgest.sinks.shards.store import ShardStore


class ShardVerificationError(ImgestError):
    """A published shard is missing or its bytes differ from manifest.json."""


@dataclass
class ShardVerifyReport:
    location: str
    shards: int = 0
    samples: int = 0
    bytes: int = 0
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
            "mismatches": self.mismatches,
        }


def _sha256(store: ShardStore, name: str) -> str | None:
    chunks = store.read_chunks(name)
    if chunks is None:
        return None
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(chunk)
    return h.hexdigest()


def verify_shards(store: ShardStore) -> ShardVerifyReport:
    """Stream every listed shard and compare its sha256 with manifest.json (memory stays flat)."""
    manifest = store.read_manifest()
    if manifest is None:
        raise ShardVerificationError(f"no manifest.json at {store.location}: the dataset is not published")
    report = ShardVerifyReport(store.location)
    for entry in manifest["shards"]:
        report.shards += 1
        report.samples += entry["samples"]
        report.bytes += entry["bytes"]
        digest = _sha256(store, entry["name"])
        if digest != entry["sha256"]:
            report.mismatches.append(f"{entry['name']}: {'missing' if digest is None else 'sha256 differs'}")
    return report
