"""Verification of a Cassandra ingest: counts per split and label, byte-equal samples, then 'complete'."""

from __future__ import annotations

import json
import logging
import random
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imgest.core import workdir
from imgest.core.errors import ImgestError
from imgest.sinks.cassandra.schema import TableLayout
from imgest.sinks.cassandra.versions import advance_status, version_rows
from imgest.sources.manifest import Candidate, iter_manifest, manifest_metadata
from imgest.sources.read import read_candidate
from imgest.transform.image import TransformSpec, transform_image

log = logging.getLogger(__name__)


class VerificationError(ImgestError):
    """Stored data does not match the manifest."""


@dataclass
class VerifyReport:
    dataset: str
    version: str
    ok: bool = True
    expected: dict[str, int] = field(default_factory=dict)
    found: dict[str, int] = field(default_factory=dict)
    count_mismatches: dict[str, tuple[int, int]] = field(default_factory=dict)
    sampled: int = 0
    byte_mismatches: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "version": self.version,
            "ok": self.ok,
            "rows_expected": sum(self.expected.values()),
            "rows_found": sum(self.found.values()),
            "count_mismatches": {k: {"expected": e, "found": f} for k, (e, f) in self.count_mismatches.items()},
            "sampled": self.sampled,
            "byte_mismatches": self.byte_mismatches,
        }


def _version_row(session: Any, tables: TableLayout, dataset: str, version: str) -> Any:
    row = session.execute(
        f"SELECT * FROM {tables.keyspace}.dataset_versions WHERE dataset = %s AND version = %s", (dataset, version)
    ).one()
    if row is None:
        raise VerificationError(f"no version {version!r} of dataset {dataset!r} in {tables.keyspace}.dataset_versions")
    return row


def _expected_counts(
    manifest_dir: Path, quarantined: set[str], sample: int, seed: int
) -> tuple[Counter[str], list[Candidate]]:
    """Rows expected per split/label, and a uniform reservoir sample of SAMPLE of them (flat memory)."""
    expected: Counter[str] = Counter()
    rng = random.Random(seed)
    picked: list[Candidate] = []
    seen = 0
    for cand in iter_manifest(manifest_dir / workdir.MANIFEST):
        if cand.id in quarantined:
            continue
        expected[f"{cand.split}/{cand.label}"] += 1
        seen += 1
        if len(picked) < sample:
            picked.append(cand)
        elif (slot := rng.randrange(seen)) < sample:
            picked[slot] = cand
    return expected, picked


def verify(
    session: Any,
    manifest_dir: Path,
    tables: TableLayout,
    dataset: str | None,
    version: str,
    sample: int = 32,
    seed: int = 0,
    mark_complete: bool = True,
) -> VerifyReport:
    """Compare the rows of VERSION (only those) with the manifest minus the quarantine; on success mark the
    version complete (only from 'written')."""
    meta = manifest_metadata(manifest_dir / workdir.MANIFEST)
    dataset = dataset or meta["dataset"]
    record = _version_row(session, tables, dataset, version)
    spec = TransformSpec.from_record(json.loads(record.transform))
    splits = sorted(json.loads(record.tables))
    quarantined = {
        str(r.id)
        for r in session.execute(
            f"SELECT id FROM {tables.keyspace}.quarantine WHERE dataset = %s AND version = %s", (dataset, version)
        )
    }
    report = VerifyReport(dataset, version)
    expected, picked = _expected_counts(manifest_dir, quarantined, sample, seed)
    found: Counter[str] = Counter()
    for table in sorted({tables.metadata_table(split) for split in splits}):  # one table for all splits, or one each
        for row in version_rows(session, f"{tables.keyspace}.{table}", dataset, version, "split, label"):
            found[f"{row.split}/{row.label}"] += 1
    report.expected, report.found = dict(expected), dict(found)
    for key in sorted(set(expected) | set(found)):
        if expected[key] != found[key]:
            report.count_mismatches[key] = (expected[key], found[key])
    root = Path(meta["root"])
    for cand in picked:
        stmt = f"SELECT data FROM {tables.keyspace}.{tables.data_table(cand.split)} WHERE id = %s"
        row = session.execute(stmt, (uuid.UUID(cand.id),)).one()
        fresh = transform_image(read_candidate(root, cand), spec).data
        report.sampled += 1
        if row is None or bytes(row.data) != fresh:
            report.byte_mismatches.append(cand.rel_path)
    report.ok = not report.count_mismatches and not report.byte_mismatches
    done = ("written", "complete")
    if report.ok and mark_complete and not advance_status(session, tables.keyspace, dataset, version, "complete", done):
        raise VerificationError(
            f"version {version!r} of {dataset!r} matches but its status is {record.status!r}, not 'written': "
            "finish (or re-run) its ingest first; replaced versions cannot be completed"
        )
    log.info("verify %s/%s: %s", dataset, version, "ok" if report.ok else "MISMATCH")
    return report
