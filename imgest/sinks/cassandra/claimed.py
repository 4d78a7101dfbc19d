"""What the Cassandra ingest job's driver settles before any row is written (jobs/ingest_cassandra.claim)."""

from __future__ import annotations

from dataclasses import dataclass

from imgest.core.quarantine import QuarantineLog
from imgest.sinks.cassandra.bulk_writer import BulkTarget
from imgest.sinks.cassandra.ingest import CassandraIngestConfig
from imgest.sinks.cassandra.write_path import WritePath


@dataclass(frozen=True)
class Claimed:
    """What the job's driver settled before any row: the config (fresh or not), the scan's classes, splits and
    quarantine, the write path chosen and why, the bulk target (None: CQL), the tables whose compaction is held,
    and the seconds the job waited for its command's scan (None: the scan was done before the job started)."""

    cfg: CassandraIngestConfig
    classes: list[str]
    splits: list[str]
    scan_quarantine: QuarantineLog
    path: WritePath
    target: BulkTarget | None
    held: list[str]
    scan_wait_s: float | None = None
