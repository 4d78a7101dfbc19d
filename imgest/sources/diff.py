"""What changed in a source since the last stored version: added, changed, removed, unchanged images.

A refresh scans again and compares the new manifest with the baseline (the manifest of the last complete
version plus each image's source sha256). Same id, size, mtime and label: unchanged, not read. Size or mtime
differ: the file is hashed and only a different hash (or label) makes it changed. Ids are deterministic
(dataset/split/path), so a changed image keeps its id and is re-ingested in place.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from imgest.core.quarantine import BadImage
from imgest.sources.manifest import Candidate
from imgest.sources.read import read_candidate

HASH_COLUMN = "src_sha256"
MISSING_HASH = ""  # a file that vanished or could not be read while hashing: ingest quarantines it


@dataclass
class SourceChanges:
    """Ids per kind of change; ``unchanged`` is a count (those rows are not touched)."""

    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: int = 0
    touched_same_bytes: int = 0  # size or mtime differed but the hash did not: unchanged, not re-ingested

    @property
    def any(self) -> bool:
        return bool(self.added or self.changed or self.removed)

    def all_changed(self, ids: list[str]) -> SourceChanges:
        """These changes with every one of IDS (the current rows) that is not added counted as changed."""
        added = set(self.added)
        changed = [i for i in ids if i not in added]
        return SourceChanges(self.added, changed, self.removed, 0, self.touched_same_bytes)

    def counts(self) -> dict[str, int]:
        return {
            "added": len(self.added),
            "changed": len(self.changed),
            "removed": len(self.removed),
            "unchanged": self.unchanged,
        }


def hash_candidates(root: Path, cands: list[Candidate], workers: int = 4) -> list[str]:
    """Source sha256 of each candidate (hashlib releases the GIL: threads overlap reading and hashing)."""

    def one(cand: Candidate) -> str:
        try:
            return hashlib.sha256(read_candidate(root, cand)).hexdigest()
        except BadImage:
            return MISSING_HASH

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, cands))


def diff_manifest(manifest: Path, baseline: Path | None, root: Path) -> tuple[SourceChanges, pa.Table]:
    """Compare MANIFEST with BASELINE (None: everything is added); returns the changes and the new baseline
    (the manifest's rows with their source sha256)."""
    table = pq.read_table(manifest)
    rows = table.to_pylist()
    old = _baseline_index(baseline)
    changes = SourceChanges()
    hashes: list[str] = [MISSING_HASH] * len(rows)
    suspects: list[int] = []
    for i, row in enumerate(rows):
        before = old.get(row["id"])
        if before is None:
            changes.added.append(row["id"])
            suspects.append(i)
        elif (before["size"], before["mtime"], before["label"], before["wnid"]) == (
            row["size"],
            row["mtime"],
            row["label"],
            row["wnid"],
        ):
            hashes[i] = before[HASH_COLUMN]
            changes.unchanged += 1
        else:
            suspects.append(i)
    fresh = hash_candidates(root, [Candidate(**rows[i]) for i in suspects])
    added = set(changes.added)
    for i, digest in zip(suspects, fresh, strict=True):
        hashes[i] = digest
        row = rows[i]
        if row["id"] in added:
            continue
        before = old[row["id"]]
        same = (
            digest
            and digest == before[HASH_COLUMN]
            and (row["label"], row["wnid"]) == (before["label"], before["wnid"])
        )
        if same:
            changes.unchanged += 1
            changes.touched_same_bytes += 1
        else:
            changes.changed.append(row["id"])
    current = {row["id"] for row in rows}
    changes.removed = sorted(i for i in old if i not in current)
    return changes, table.append_column(HASH_COLUMN, pa.array(hashes, pa.string()))


def _baseline_index(baseline: Path | None) -> dict[str, dict[str, object]]:
    if baseline is None or not baseline.is_file():
        return {}
    table = pq.read_table(baseline, columns=["id", "size", "mtime", "label", "wnid", HASH_COLUMN])
    return {row["id"]: row for row in table.to_pylist()}


def select_ids(table: pa.Table, ids: list[str]) -> pa.Table:
    """The rows of TABLE whose id is in IDS, in TABLE's order."""
    return table.filter(pc.is_in(table.column("id"), value_set=pa.array(ids, pa.string())))


def write_table(table: pa.Table, path: Path) -> None:
    """Write TABLE to PATH atomically (a crash leaves the old file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    pq.write_table(table, tmp, compression="zstd")
    tmp.replace(path)
