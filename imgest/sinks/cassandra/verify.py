"""Verification of a Cassandra ingest: counts per split and label, a byte-equal sample, then 'complete'.

Counts are not rescanned by default: the job records what it wrote per split and label in the version record
(``label_counts``, from rows the store acknowledged), and those are compared with the manifest minus the
quarantine. The table is counted only when asked (``count_rows``; a refresh does, since its job wrote only the
delta) or when the record has no final counts, and then by a token-range scan of two narrow columns
(imgest.sinks.cassandra.scan), never ``ALLOW FILTERING``. A seeded, class-balanced sample of rows is read back
and compared byte for byte with a fresh transform of its source, and its metadata row with the data's sha256.
The manifest is read as Arrow batches: memory stays flat whatever the dataset's size. The sample's candidates
are pruned after every batch to the rows that can still be picked (about the sample's size, plus one key per
label; see _prune), so neither their memory nor their sorting grows with the number of labels.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from imgest.core import workdir
from imgest.core.errors import ImgestError
from imgest.core.idset import IdSet
from imgest.core.locks import check_fence
from imgest.sinks.cassandra.scan import count_by
from imgest.sinks.cassandra.schema import TableLayout
from imgest.sinks.cassandra.versions import advance_status
from imgest.sources.manifest import BATCH_ROWS, Candidate, manifest_metadata
from imgest.sources.read import read_candidate
from imgest.transform.image import TransformSpec, transform_image

log = logging.getLogger(__name__)
FINAL = ("written", "complete")  # statuses whose recorded counts are the job's final ones


class VerificationError(ImgestError):
    """Stored data does not match the manifest."""


@dataclass
class VerifyReport:
    dataset: str
    version: str
    ok: bool = True
    expected: dict[str, int] = field(default_factory=dict)  # "split/label" -> rows, from the manifest
    found: dict[str, int] = field(default_factory=dict)  # "split/label" -> rows, recorded or counted
    counts_from: str = "recorded"  # "recorded" (the version record) or "table" (a token-range scan)
    job_rows: int | None = None  # rows the job reported (stored + skipped), when given
    count_mismatches: dict[str, tuple[int, int]] = field(default_factory=dict)
    sampled: int = 0
    byte_mismatches: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # sampled images without a data or metadata row

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "version": self.version,
            "ok": self.ok,
            "rows_expected": sum(self.expected.values()),
            "rows_found": sum(self.found.values()),
            "counts_from": self.counts_from,
            "job_rows": self.job_rows,
            "count_mismatches": {k: {"expected": e, "found": f} for k, (e, f) in self.count_mismatches.items()},
            "sampled": self.sampled,
            "byte_mismatches": self.byte_mismatches,
            "missing_rows": self.missing,
        }


def _version_row(session: Any, tables: TableLayout, dataset: str, version: str) -> Any:
    row = session.execute(
        f"SELECT * FROM {tables.keyspace}.dataset_versions WHERE dataset = %s AND version = %s", (dataset, version)
    ).one()
    if row is None:
        raise VerificationError(f"no version {version!r} of dataset {dataset!r} in {tables.keyspace}.dataset_versions")
    return row


class _Floors:
    """Per label the lowest key of the rows dropped from the sample's pool. A later row of that label with a higher
    key ranks behind a dropped row, so it can never be picked either: it is dropped on arrival, and every row the
    pool keeps has its true rank within its label (every dropped row of a label has a higher key than its kept ones).
    One key per label, held as numpy columns."""

    def __init__(self) -> None:
        self.labels = np.zeros(0, dtype=np.int64)
        self.keys = np.zeros(0, dtype=np.float64)

    def below(self, labels: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Which rows (LABELS, KEYS) have a key below their label's floor (every row of a label without one)."""
        if not len(self.labels):
            return np.ones(len(labels), dtype=bool)
        at = np.minimum(np.searchsorted(self.labels, labels), len(self.labels) - 1)
        return (self.labels[at] != labels) | (keys < self.keys[at])

    def add(self, labels: np.ndarray, keys: np.ndarray) -> None:
        """Lower the floors of LABELS to KEYS where those are lower."""
        labels, keys = np.r_[self.labels, labels.astype(np.int64)], np.r_[self.keys, keys]
        order = np.lexsort((keys, labels))
        first = np.r_[True, labels[order][1:] != labels[order][:-1]]
        self.labels, self.keys = labels[order][first], keys[order][first]


def _prune(pool: pa.Table, sample: int, floors: _Floors) -> pa.Table:
    """POOL with each row's 'rank' (by 'key') within its label, less the rows that can never be among the SAMPLE
    picked (the first SAMPLE by rank, then key), whose keys lower FLOORS.

    Ranks only grow as rows arrive. With level L the lowest rank at which the rows of rank <= L reach SAMPLE, a row
    of rank > L is never picked, nor one of rank L behind the NEED = SAMPLE - (rows of rank < L) lowest keys of that
    rank: those NEED labels keep a key of rank L below it whatever arrives. What stays is at most about SAMPLE rows,
    whatever the number of labels."""
    labels, keys = pool.column("label").to_numpy(), pool.column("key").to_numpy()
    order = np.lexsort((keys, labels))
    ranked = labels[order]
    starts = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]])
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    pool = pool.set_column(pool.schema.get_field_index("rank"), "rank", pa.array(rank))
    if len(rank) <= sample:
        return pool
    reach = np.cumsum(np.bincount(rank))
    level = int(np.searchsorted(reach, sample))  # the first rank at which rows of rank <= it reach SAMPLE
    need = sample - (int(reach[level - 1]) if level else 0)
    at_level = keys[rank == level]
    last = np.partition(at_level, need - 1)[need - 1]
    keep = (rank < level) | ((rank == level) & (keys <= last))
    floors.add(labels[~keep], keys[~keep])
    return pool.filter(pa.array(keep))


def expected_counts(
    manifest: Path, quarantined: set[str], sample: int, seed: int
) -> tuple[Counter[str], list[Candidate]]:
    """Rows expected per 'split/label' (the manifest minus QUARANTINED) and a seeded, class-balanced sample of
    SAMPLE of them: every label's lowest random keys, taken round-robin across labels (all labels' lowest key
    first, by key, then their second lowest...). Reads Arrow batches; the pool of candidates stays at about SAMPLE
    rows plus a batch, and one key per label, whatever the number of labels (see _prune)."""
    expected: Counter[str] = Counter()
    rng = np.random.default_rng([seed, 11])
    bad = IdSet(sorted(quarantined))  # built once, asked of every batch
    floors = _Floors()
    pool: pa.Table | None = None
    for batch in pq.ParquetFile(manifest).iter_batches(batch_size=BATCH_ROWS):
        table = pa.Table.from_batches([batch])
        table = table.filter(pc.invert(bad.contains(table.column("id"))))
        grouped = table.group_by(["split", "label"]).aggregate([([], "count_all")])
        for row in grouped.to_pylist():
            expected[f"{row['split']}/{row['label']}"] += row["count_all"]
        if sample <= 0 or not table.num_rows:
            continue
        keys = rng.random(table.num_rows)
        table = table.append_column("key", pa.array(keys)).append_column(
            "rank", pa.array(np.zeros(table.num_rows, dtype=np.int64))
        )
        table = table.filter(pa.array(floors.below(table.column("label").to_numpy(), keys)))
        pool = _prune(table if pool is None else pa.concat_tables([pool, table]), sample, floors)
    if pool is None:
        return expected, []
    picked = pool.sort_by([("rank", "ascending"), ("key", "ascending")]).slice(0, sample)
    return expected, [Candidate(**row) for row in picked.drop_columns(["key", "rank"]).to_pylist()]


def table_counts(
    session: Any, tables: TableLayout, splits: list[str], dataset: str, version: str | list[str]
) -> Counter[str]:
    """Rows of DATASET / VERSION (a version's members when a list) per 'split/label' in its metadata tables, by
    token-range scans."""
    found: Counter[str] = Counter()
    for table in sorted({tables.metadata_table(split) for split in splits}):  # one table for all splits, or one each
        found.update(count_by(session, f"{tables.keyspace}.{table}", ["split", "label"], dataset, version))
    return found


def _check_sample(
    session: Any, tables: TableLayout, root: Path, spec: TransformSpec, members: list[str], picked: list[Candidate]
) -> tuple[list[str], list[str]]:
    """(missing, differing) relative paths of PICKED: no data or metadata row of the version (written by one of
    its MEMBERS), or bytes (or their
    recorded sha256) unlike a fresh transform of the source."""
    missing, differing = [], []
    ks = tables.keyspace
    for cand in picked:
        key = (uuid.UUID(cand.id),)
        data = session.execute(f"SELECT data FROM {ks}.{tables.data_table(cand.split)} WHERE id = %s", key).one()
        meta = session.execute(
            f"SELECT sha256, version FROM {ks}.{tables.metadata_table(cand.split)} WHERE id = %s", key
        ).one()
        if data is None or meta is None or meta.version not in members:
            missing.append(cand.rel_path)
            continue
        fresh = transform_image(read_candidate(root, cand), spec).data
        if bytes(data.data) != fresh or meta.sha256 != hashlib.sha256(fresh).hexdigest():
            differing.append(cand.rel_path)
    return missing, differing


def verify(
    session: Any,
    manifest_dir: Path,
    tables: TableLayout,
    dataset: str | None,
    version: str,
    sample: int = 32,
    seed: int = 0,
    mark_complete: bool = True,
    count_rows: bool = False,
    job_rows: int | None = None,
) -> VerifyReport:
    """Compare the rows of VERSION (only those) with the manifest minus the quarantine; on success mark the
    version complete (only from 'written'). Counts are the version record's (the job's) unless COUNT_ROWS, or
    the record has no final counts: then the table's, by token-range scan. JOB_ROWS (the job summary's stored +
    skipped) must equal the recorded total when given."""
    meta = manifest_metadata(manifest_dir / workdir.MANIFEST)
    dataset = dataset or meta["dataset"]
    record = _version_row(session, tables, dataset, version)
    spec = TransformSpec.from_record(json.loads(record.transform))
    splits = sorted(json.loads(record.tables))
    members = list(getattr(record, "lineage", None) or [version])
    quarantined = {
        str(r.id)
        for r in session.execute(
            f"SELECT id FROM {tables.keyspace}.quarantine WHERE dataset = %s AND version = %s", (dataset, version)
        )
    }
    report = VerifyReport(dataset, version, job_rows=job_rows)
    expected, picked = expected_counts(manifest_dir / workdir.MANIFEST, quarantined, sample, seed)
    recorded = dict(record.label_counts or {})
    if count_rows or not recorded or record.status not in FINAL:
        report.counts_from = "table"
        found: Counter[str] = table_counts(session, tables, splits, dataset, members)
    else:
        found = Counter(recorded)
    report.expected, report.found = dict(expected), dict(found)
    for key in sorted(set(expected) | set(found)):
        if expected[key] != found[key]:
            report.count_mismatches[key] = (expected[key], found[key])
    if job_rows is not None and job_rows != sum(recorded.values()):
        report.count_mismatches["job"] = (job_rows, sum(recorded.values()))
    report.missing, report.byte_mismatches = _check_sample(session, tables, Path(meta["root"]), spec, members, picked)
    report.sampled = len(picked)
    report.ok = not report.count_mismatches and not report.byte_mismatches and not report.missing
    ks = tables.keyspace
    if report.ok and mark_complete:
        check_fence(dataset)  # a process that lost the dataset's lock completes nothing
    if report.ok and mark_complete and not advance_status(session, ks, dataset, version, "complete", FINAL):
        raise VerificationError(
            f"version {version!r} of {dataset!r} matches but its status is {record.status!r}, not 'written': "
            "finish (or re-run) its ingest first; replaced versions cannot be completed"
        )
    outcome = "ok" if report.ok else "MISMATCH"
    log.info("verify %s/%s: %s (counts from %s)", dataset, version, outcome, report.counts_from)
    return report
