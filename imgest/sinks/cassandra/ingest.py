"""Ingest into Cassandra: the per-partition work the Spark job runs, and the dataset-version record.

Idempotent and incremental: ids are deterministic, so a re-run overwrites instead of duplicating, and an
image whose metadata row already holds the same source hash and transform is skipped, so a crashed run
resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from dataclasses import replace as with_fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from imgest.core import defaults
from imgest.core.locks import check_fence
from imgest.core.quarantine import QuarantineLog
from imgest.core.settings import CassandraSettings
from imgest.sinks.cassandra.bulk_writer import BulkImageWriter, BulkTarget, HelperCqlWriter
from imgest.sinks.cassandra.client import shared_session
from imgest.sinks.cassandra.schema import TableLayout, apply_schema
from imgest.sinks.cassandra.versions import advance_status, claim_version
from imgest.sinks.cassandra.writer import DEFAULT_MAX_BLOB_BYTES, ImageWriter, Row
from imgest.sources.manifest import Candidate, chunked
from imgest.transform.image import TransformSpec
from imgest.transform.pipeline import process_candidates

log = logging.getLogger(__name__)
LOOKUP_CHUNK = 100
META_COLUMNS = (
    "id",
    "label",
    "wnid",
    "split",
    "rel_path",
    "width",
    "height",
    "nbytes",
    "sha256",
    "src_sha256",
    "transform_key",
    "dataset",
    "version",
)


def transform_key(spec: TransformSpec) -> str:
    """Short stable digest of the transform settings (part of the default version name)."""
    return key_of_fields(spec.as_dict())


def key_of_fields(fields: dict[str, Any]) -> str:
    """transform_key of a transform's FIELDS (TransformSpec.as_dict), also for a spec this installation cannot build
    (a region decoder where the compiled module is missing)."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class CassandraIngestConfig:
    """Everything a partition needs; serialisable to ship to Spark executors.

    CONNECTION (credentials, TLS CA text, protocol, local DC) is resolved once by the driver and travels
    inside the pickled task, never in Spark conf, argv or the executors' environment; its repr hides the
    password. Without it, executors read their own environment.
    """

    root: str
    dataset: str
    version: str
    tables: TableLayout
    spec: TransformSpec
    hosts: tuple[str, ...] = ()  # () : the connection's
    port: int = 9042
    max_in_flight: int = defaults.MAX_IN_FLIGHT
    max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES
    consistency: str = defaults.CONSISTENCY
    replace: bool = False  # replace another version of the dataset that lives in the same tables
    connection: CassandraSettings | None = None
    # a version no earlier run claimed: none of its rows can be committed, so partitions skip the lookup of
    # committed rows before writing (a synchronous read per LOOKUP_CHUNK rows); a rerun or resume looks them up
    fresh: bool = False
    bulk: BulkTarget | None = None  # set by the driver when rows go through the bulk-load helper

    def settings(self) -> CassandraSettings:
        """Connection settings: the driver's (shipped with the task), else the environment's; hosts, port and
        consistency from this config."""
        base = self.connection or CassandraSettings.from_env(",".join(self.hosts) or None)
        return with_fields(base, hosts=self.hosts or base.hosts, port=self.port, consistency=self.consistency)


@dataclass
class PartitionResult:
    """What one partition did."""

    stored: int = 0
    skipped: int = 0
    bytes: int = 0
    retries: int = 0
    loads: int = 0  # bulk rounds streamed (WriteStats.loads)
    counts: Counter[str] = field(default_factory=Counter)  # "split/label" of stored + skipped rows
    quarantine: list[dict[str, Any]] = field(default_factory=list)

    def merge(self, other: PartitionResult) -> None:
        self.stored += other.stored
        self.skipped += other.skipped
        self.bytes += other.bytes
        self.retries += other.retries
        self.loads += other.loads
        self.counts.update(other.counts)
        self.quarantine.extend(other.quarantine)


def batch_insert(tables: TableLayout, split: str) -> str:
    """SPLIT's data-row and metadata-row inserts as one UNLOGGED batch (bind: id, label, data, then META_COLUMNS)."""
    ks, data, meta = tables.keyspace, tables.data_table(split), tables.metadata_table(split)
    cols = ", ".join(META_COLUMNS)
    return (
        f"BEGIN UNLOGGED BATCH INSERT INTO {ks}.{data} (id, label, data) VALUES (?, ?, ?); "
        f"INSERT INTO {ks}.{meta} ({cols}) VALUES ({', '.join('?' * len(META_COLUMNS))}); APPLY BATCH"
    )


class _Statements:
    """Prepared statements per split, prepared once per session."""

    def __init__(self, session: Any, tables: TableLayout) -> None:
        self._session, self._tables, self._cache = session, tables, {}

    def inserts(self, split: str) -> Any:
        """SPLIT's data-row and metadata-row inserts as one prepared UNLOGGED batch (bind: data values, then
        META_COLUMNS' values)."""
        key = ("insert", split)
        if key not in self._cache:
            self._cache[key] = self._session.prepare(batch_insert(self._tables, split))
        return self._cache[key]

    def lookup(self, split: str) -> Any:
        key = ("lookup", split)
        if key not in self._cache:
            ks, meta = self._tables.keyspace, self._tables.metadata_table(split)
            self._cache[key] = self._session.prepare(
                f"SELECT id, src_sha256, transform_key, version FROM {ks}.{meta} WHERE id IN ?"
            )
        return self._cache[key]

    def stamp(self, split: str) -> Any:
        """UPDATE of a committed row's dataset/version (rows written before those columns existed)."""
        key = ("stamp", split)
        if key not in self._cache:
            ks, meta = self._tables.keyspace, self._tables.metadata_table(split)
            self._cache[key] = self._session.prepare(f"UPDATE {ks}.{meta} SET dataset = ?, version = ? WHERE id = ?")
        return self._cache[key]

    def quarantine(self) -> Any:
        if "quarantine" not in self._cache:
            self._cache["quarantine"] = self._session.prepare(
                f"INSERT INTO {self._tables.keyspace}.quarantine"
                " (dataset, version, id, split, rel_path, reason, detail) VALUES (?, ?, ?, ?, ?, ?, ?)"
            )
        return self._cache["quarantine"]


def committed(
    session: Any, stmts: _Statements, chunk: list[Candidate], cfg: CassandraIngestConfig
) -> dict[str, tuple[str, str]]:
    """id -> (src_sha256, transform_key) of the rows of CHUNK already committed by this version. Rows written
    before the dataset/version columns existed are stamped with this version and count as committed."""
    found: dict[str, tuple[str, str]] = {}
    for split in {c.split for c in chunk}:
        ids = [uuid.UUID(c.id) for c in chunk if c.split == split]
        for row in session.execute(stmts.lookup(split), (ids,)):
            if row.version is None:
                session.execute(stmts.stamp(split), (cfg.dataset, cfg.version, row.id))
            elif row.version != cfg.version:
                continue  # another version's row (being replaced): rewrite it
            found[str(row.id)] = (row.src_sha256, row.transform_key)
    return found


def _writer(
    session: Any, stmts: _Statements, cfg: CassandraIngestConfig, quarantine: QuarantineLog, written: Callable
) -> ImageWriter | BulkImageWriter | HelperCqlWriter:
    """The partition's writer: batches through the driver or through the helper's Java driver, or SSTables through
    the bulk-load helper."""
    if cfg.bulk is not None and cfg.bulk.mode == "cql":
        return HelperCqlWriter(cfg.bulk, cfg.settings(), quarantine, cfg.max_blob_bytes, on_written=written)
    if cfg.bulk is not None:
        names = lambda split: (cfg.tables.data_table(split), cfg.tables.metadata_table(split))  # noqa: E731
        return BulkImageWriter(cfg.bulk, cfg.settings(), names, quarantine, cfg.max_blob_bytes, on_written=written)
    return ImageWriter(
        session, stmts.inserts, quarantine, cfg.max_in_flight, max_blob_bytes=cfg.max_blob_bytes, on_written=written
    )


def meta_values(item: Any, key: str, cfg: CassandraIngestConfig) -> tuple[Any, ...]:
    """The metadata row of ITEM (a processed candidate), in META_COLUMNS' order."""
    c, img = item.candidate, item.image
    sha256 = item.src_sha256 if img.data is item.source else hashlib.sha256(img.data).hexdigest()
    size = (img.width, img.height, len(img.data))
    return (
        uuid.UUID(c.id),
        c.label,
        c.wnid,
        c.split,
        c.rel_path,
        *size,
        sha256,
        item.src_sha256,
        key,
        cfg.dataset,
        cfg.version,
    )


class LazySession:
    """The process's shared session (shared_session), connected on first use: a worker of the bulk or cql-helper path
    writing a new version sends its rows through the helper and looks nothing up, so it connects only to record a
    quarantined image (a connection costs 0.2 CPU seconds here, and the node answers its schema queries)."""

    def __init__(self, settings: CassandraSettings) -> None:
        self._settings = settings
        self._session: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._session is None:
            self._session = shared_session(self._settings)
        return getattr(self._session, name)


@dataclass
class Ahead:
    """What a partition's rows still to come will store: the source bytes not yet taken, scaled by the stored /
    source ratio of the chunks taken so far (1 before any: an unchanged copy)."""

    source_left: int | None  # None: the partition's source bytes are unknown
    taken: int = 0  # source bytes of the chunks taken
    stored: int = 0  # bytes stored from them (quarantined and skipped rows store none)

    def after(self, chunk: list[Candidate]) -> int | None:
        """Take CHUNK; the estimated bytes the rows after it will store."""
        if self.source_left is None:
            return None
        size = sum(c.size or 0 for c in chunk)
        ratio = self.stored / self.taken if self.taken else 1.0
        self.source_left = max(0, self.source_left - size)
        self.taken += size
        return int(self.source_left * ratio)


def ingest_partition(
    candidates: Iterable[Candidate],
    cfg: CassandraIngestConfig,
    on_row: Callable[[int], None] | None = None,
    source_bytes: int | None = None,
) -> PartitionResult:
    """Store CANDIDATES (one Spark partition): skip committed rows, quarantine bad ones, write the rest. SOURCE_BYTES
    (the candidates' sizes summed, when known) lets the writer see the partition's end coming (expect)."""
    result = PartitionResult()
    quarantine = QuarantineLog()
    key = transform_key(cfg.spec)
    root = Path(cfg.root)
    # one session per executor process; the helper paths of a new version need it only for quarantine rows
    session = shared_session(cfg.settings()) if cfg.bulk is None or not cfg.fresh else LazySession(cfg.settings())
    with nullcontext(session):
        stmts = _Statements(session, cfg.tables)

        def written(row: Row, nbytes: int) -> None:
            result.counts[f"{row.split}/{row.label}"] += 1
            if on_row:
                on_row(nbytes)

        with _writer(session, stmts, cfg, quarantine, written) as writer:
            ahead = Ahead(source_bytes)
            for chunk in chunked(candidates, LOOKUP_CHUNK):
                writer.expect(ahead.after(chunk))
                done = {} if cfg.fresh else committed(session, stmts, chunk, cfg)

                def already_stored(cand: Candidate, src_sha256: str, done: dict = done) -> bool:
                    if done.get(cand.id) != (src_sha256, key):
                        return False
                    result.skipped += 1
                    result.counts[f"{cand.split}/{cand.label}"] += 1
                    return True

                for item in process_candidates(chunk, root, cfg.spec, quarantine, skip=already_stored):
                    c, img = item.candidate, item.image
                    writer.write(
                        Row(uuid.UUID(c.id), c.label, img.data, c.split, meta_values(item, key, cfg), c.rel_path)
                    )
                    ahead.stored += len(img.data)
        result.stored = writer.stats.written
        result.bytes = writer.stats.bytes
        result.retries = writer.stats.retries
        result.loads = writer.stats.loads
        for entry in quarantine.entries:
            session.execute(
                stmts.quarantine(),
                (cfg.dataset, cfg.version, uuid.UUID(entry.id), entry.split, entry.path, entry.reason, entry.detail),
            )
        result.quarantine = [{**asdict(e), "reason": str(e.reason)} for e in quarantine.entries]
    return result


# ---- dataset version record (driver side) -------------------------------------------------------------


def begin_version(session: Any, cfg: CassandraIngestConfig, splits: list[str], replication: str) -> str | None:
    """Create the schema if needed and mark the version 'writing' (a complete one stays complete); refuses
    to overwrite another version's rows unless CFG.replace. Returns the status the version had before. Fenced: a
    process that lost the dataset's lock raises LockLostError before the record changes."""
    apply_schema(session, cfg.tables, splits, replication)
    check_fence(cfg.dataset)
    return claim_version(
        session,
        cfg.tables.keyspace,
        cfg.dataset,
        cfg.version,
        cfg.tables.tables(splits),
        json.dumps(cfg.spec.as_dict()),
        cfg.replace,
    )


def finish_version(session: Any, cfg: CassandraIngestConfig, total: PartitionResult, classes: list[str]) -> None:
    """Record counts and quarantine summary; status 'written' unless already 'complete' (verify completes it).
    Fenced: a process that lost the dataset's lock raises LockLostError before the record changes."""
    check_fence(cfg.dataset)
    split_counts: Counter[str] = Counter()
    for key, n in total.counts.items():
        split_counts[key.split("/")[0]] += n
    reasons = {str(reason): n for reason, n in Counter(q["reason"] for q in total.quarantine).items()}
    stmt = session.prepare(
        f"UPDATE {cfg.tables.keyspace}.dataset_versions SET split_counts = ?, label_counts = ?,"
        " class_map = ?, quarantine_count = ?, quarantine_reasons = ?, finished_at = ?"
        " WHERE dataset = ? AND version = ?"
    )
    values = (dict(split_counts), dict(total.counts), classes, len(total.quarantine), reasons, datetime.now(UTC))
    session.execute(stmt, (*values, cfg.dataset, cfg.version))
    advance_status(session, cfg.tables.keyspace, cfg.dataset, cfg.version, "written", ("writing",))


def summary(total: PartitionResult, seconds: float, scan_quarantine: QuarantineLog) -> dict[str, Any]:
    """The JSON summary printed and written at the end of a job; counts reconcile with the scan."""
    reasons = Counter(q["reason"] for q in total.quarantine) + Counter(scan_quarantine.by_reason())
    quarantined = len(total.quarantine) + len(scan_quarantine)
    return {
        "candidates": total.stored + total.skipped + quarantined,
        "stored": total.stored,
        "skipped_already_committed": total.skipped,
        "quarantined": quarantined,
        "quarantined_by_reason": dict(sorted(reasons.items())),
        "retries": total.retries,
        **({"bulk_loads": total.loads} if total.loads else {}),
        "seconds": round(seconds, 2),
        "rows_per_s": round((total.stored + total.skipped) / seconds, 1) if seconds else None,
        "stored_mb_per_s": round(total.bytes / 1e6 / seconds, 2) if seconds else None,
        "stored_bytes": total.bytes,
    }
