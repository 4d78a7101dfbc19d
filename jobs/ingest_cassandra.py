"""Spark job: ingest a scanned dataset into Cassandra tables.

    spark-submit --master local[*] jobs/ingest_cassandra.py --manifest-dir DIR [options]

Usually started by `imgest ingest cassandra` or the `ingest_imagenet` DAG. Credentials come from the
driver's environment (IMGEST_CASSANDRA_USER / IMGEST_CASSANDRA_PASSWORD), never from arguments; the driver
resolves the connection once and ships it to executors inside the tasks, so executors need no environment.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from imgest.core import workdir
from imgest.core.errors import ImgestError
from imgest.core.lock_stores import use_cassandra
from imgest.core.locks import submitter_holdings
from imgest.core.phases import PhaseClock
from imgest.core.quarantine import QuarantineLog
from imgest.core.settings import CassandraSettings
from imgest.core.staging import Stager
from imgest.sinks.cassandra import compaction_hold, write_path
from imgest.sinks.cassandra.bulk_helper import BulkLoadError, helper_archive
from imgest.sinks.cassandra.bulk_writer import BulkTarget
from imgest.sinks.cassandra.claimed import Claimed
from imgest.sinks.cassandra.client import cassandra_session, explain_unavailable
from imgest.sinks.cassandra.ingest import (
    CassandraIngestConfig,
    PartitionResult,
    begin_version,
    finish_version,
    ingest_partition,
    summary,
    transform_key,
)
from imgest.sinks.cassandra.schema import TableLayout
from imgest.sources.manifest import manifest_metadata, read_classes
from imgest.sources.s3source import shippable_root
from imgest.spark.failures import nothing_ingestible, report_failure
from imgest.spark.job_options import CASSANDRA_OPTIONS, TRANSFORM_OPTIONS, job_parser
from imgest.spark.manifest_rdd import Candidates, candidate_rdd, manifest_rows, run_candidates
from imgest.spark.partitions import connected, parallelism
from imgest.spark.pypath import prefer_installed_pyspark
from imgest.spark.scan_handoff import wait_for_scan
from imgest.spark.submit import emit_summary, job_logging, stop_session
from imgest.transform.image import TransformSpec

log = logging.getLogger("imgest.jobs.ingest_cassandra")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = job_parser("ingest_cassandra", __doc__, CASSANDRA_OPTIONS, TRANSFORM_OPTIONS)
    p.add_argument(
        "--wait-for-scan",
        type=Path,
        metavar="MARKER",
        help="read the manifest once MARKER.done exists: the command scans while the session starts (scan_handoff)",
    )
    return p.parse_args(argv)


def build_config(args: argparse.Namespace) -> CassandraIngestConfig:
    meta = manifest_metadata(args.manifest_dir / workdir.MANIFEST)
    spec = TransformSpec.from_args(args)
    connection = connection_settings(args)
    use_cassandra(connection)  # the keyspace's lock store, which the driver fences with, is reached the same way
    return CassandraIngestConfig(
        root=shippable_root(meta["root"]),  # an S3 source's connection travels inside the tasks
        dataset=args.dataset or meta["dataset"],
        version=args.version or f"t-{transform_key(spec)}",
        tables=TableLayout(args.keyspace, args.table_layout, args.table_suffix),
        spec=spec,
        hosts=connection.hosts,
        port=connection.port,
        max_in_flight=args.max_in_flight,
        max_blob_bytes=args.max_blob_bytes,
        consistency=connection.consistency,
        replace=args.replace_version,
        connection=connection,
    )


def connection_settings(args: argparse.Namespace) -> CassandraSettings:
    """The driver's connection settings (environment, then flags), CA text inside, shipped to executors."""
    env = CassandraSettings.from_env(args.hosts, args.port)
    return replace(
        env,
        consistency=args.consistency or env.consistency,
        local_dc=args.local_dc or env.local_dc,
        protocol_version=args.protocol_version or env.protocol_version,
        ssl_ca_file=args.ssl_ca or env.ssl_ca_file,
        ssl_cert_file=args.ssl_cert or env.ssl_cert_file,
        ssl_key_file=args.ssl_key or env.ssl_key_file,
    ).shippable()


def load(spark: Any, candidates: Candidates, cfg: CassandraIngestConfig) -> PartitionResult:
    """Run ingest_partition on every partition (told its source bytes where the candidates have them, by partition
    index); log progress while it runs."""
    where = f"{cfg.tables.keyspace} ({cfg.tables.layout}) at {cfg.consistency}"
    log.info("ingesting %d rows of %s version %s into %s", candidates.rows, cfg.dataset, cfg.version, where)
    source_bytes = candidates.source_bytes

    def partition(index: int, it: Any, on_row: Any) -> PartitionResult:
        return ingest_partition(it, cfg, on_row, source_bytes[index] if source_bytes else None)

    total = PartitionResult()
    for part in run_candidates(spark, candidates, partition, log, "ingest"):
        total.merge(part)
    return total


@submitter_holdings()  # the lock its submitter holds: the driver fences its publishing with it
def main(argv: Sequence[str] | None = None) -> int:
    job_logging("cassandra", "py4j")
    args = parse_args(argv)
    try:
        phases = PhaseClock()
        spark, claimed = claim_while_spark_starts(args, phases)
        cfg, target, held = claimed.cfg, claimed.target, claimed.held
        try:
            total, seconds = write_rows(spark, cfg, args, target, phases)
        finally:
            give_compaction_back(cfg, held)
        phases.lap("compaction_back")
        with cassandra_session(cfg.settings()) as session, explain_unavailable(session):
            finish_version(session, cfg, total, claimed.classes)
        phases.lap("finish_version")
        report = {
            "dataset": cfg.dataset,
            "version": cfg.version,
            "keyspace": cfg.tables.keyspace,
            "tables": cfg.tables.tables(claimed.splits),
            "write_path": {"path": claimed.path.path, "reason": claimed.path.reason},
            "compaction_held": held,
            **summary(total, seconds, claimed.scan_quarantine),
            "phase_seconds": phases.laps,
        }
        if claimed.scan_wait_s is not None:
            report["scan_wait_s"] = round(claimed.scan_wait_s, 3)
        emit_summary(report, args.summary_json)
        stop_session(spark)
        return 0
    except Exception as exc:  # the job's last line is the sentence; the trace stays in the log
        return report_failure(log, "ingest", exc)


def claim(args: argparse.Namespace) -> Claimed:
    """The Cassandra side before any row, once the scan is there (--wait-for-scan): the schema and the version record
    (begin_version), the scan's quarantine, the write path, compaction held for a bulk load."""
    waited = wait_for_scan(args.wait_for_scan)
    cfg = build_config(args)
    classes = [c.wnid for c in read_classes(args.manifest_dir / workdir.CLASSES)]
    scan_quarantine = QuarantineLog.read(args.manifest_dir / workdir.SCAN_QUARANTINE)
    splits = sorted(json.loads((args.manifest_dir / workdir.SCAN_REPORT).read_text())["per_split"])
    with cassandra_session(cfg.settings()) as session, explain_unavailable(session):
        before = begin_version(session, cfg, splits, args.replication)
        cfg = replace(cfg, fresh=before is None)  # a new version: nothing to look up before writing
        record_scan_quarantine(session, cfg, scan_quarantine)
        path, target = choose_write_path(session, cfg, args, splits)
        held = hold_compaction(session, cfg, splits, bulk=path.path == "bulk")
    scan_wait_s = waited if args.wait_for_scan else None
    return Claimed(cfg, classes, splits, scan_quarantine, path, target, held, scan_wait_s)


def claim_while_spark_starts(args: argparse.Namespace, phases: PhaseClock) -> tuple[Any, Claimed]:
    """The Spark session and the claim at once: the session's start is the driver JVM's work, the claim waits on
    the scan (--wait-for-scan) and the nodes (schema changes), so neither waits for the other (0.7 s of the claim
    hidden in the session's 1.9 s on 2 cores). A claim that fails is raised, the session built meanwhile stopped
    with the job; a session that fails to start gives back the compaction the claim held."""
    from concurrent.futures import ThreadPoolExecutor

    import pyspark  # noqa: F401  before the claim's thread: imported beside it (GIL, import locks) it took 1.5 s, not 0.1

    from imgest.spark.submit import build_context

    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)  # the session's start is many short py4j calls, each waiting for the GIL
    with ThreadPoolExecutor(1, thread_name_prefix="imgest-claim") as pool:
        claimed = pool.submit(claim, args)
        try:
            spark = build_context("imgest-ingest-cassandra")  # RDDs only: no SparkSession to start
        except BaseException:
            failed = claimed.exception()
            if failed is None:
                give_compaction_back(claimed.result().cfg, claimed.result().held)
            else:  # both failed: the session's error is raised, the claim's logged
                log.error("the claim failed too: %s", failed)
            raise
        finally:
            sys.setswitchinterval(switch)
        phases.lap("spark_session")
        result = claimed.result()
        phases.lap("schema_and_claim")  # what the claim took beyond the session's start
    return spark, result


def write_rows(
    spark: Any, cfg: CassandraIngestConfig, args: argparse.Namespace, target: BulkTarget | None, phases: PhaseClock
) -> tuple[PartitionResult, float]:
    """The Spark part: every manifest row stored, skipped or quarantined; checks that the counts reconcile.
    Returns the totals and the seconds it took."""
    cfg = replace(cfg, bulk=ship_helper(spark, target) if target else None)
    phases.lap("ship_helper")
    t0 = time.monotonic()
    with Stager.from_env(cfg.dataset) as stager:  # executors elsewhere read the manifest from the store
        partitions = args.partitions or partitions_for(cfg, spark, args.manifest_dir)
        candidates = candidate_rdd(spark, args.manifest_dir, partitions, stager)
        rows = candidates.rows
        phases.lap("manifest")
        total = load(spark, candidates, cfg)
    seconds = time.monotonic() - t0
    phases.lap("write")
    accounted = total.stored + total.skipped + len(total.quarantine)
    if accounted != rows:
        raise ImgestError(
            f"counts do not reconcile: {rows} manifest rows but {accounted} stored, skipped or "
            "quarantined; the version stays 'writing' and a re-run resumes"
        )
    if rows and total.stored + total.skipped == 0:
        raise nothing_ingestible(args.manifest_dir, "cassandra", rows, total.quarantine)
    return total, seconds


def hold_compaction(session: Any, cfg: CassandraIngestConfig, splits: list[str], bulk: bool) -> list[str]:
    """Compaction given back on tables a killed bulk load of this dataset left held (this job holds the dataset's
    lock, so that load is gone); held on this load's tables if it is bulk."""
    tables = [t for kinds in cfg.tables.tables(splits).values() for t in kinds.values()]
    compaction_hold.release(session, tables, cfg.dataset)  # a killed load of this dataset held them
    return compaction_hold.hold(session, tables, f"{cfg.dataset}/{cfg.version}") if bulk else []


def give_compaction_back(cfg: CassandraIngestConfig, held: list[str]) -> None:
    """Compaction back on HELD, the load done or failed; a failure to do so is logged, not raised over the load's
    own outcome (the next ingest of the dataset gives it back)."""
    if not held:
        return
    try:
        with cassandra_session(cfg.settings()) as session:
            compaction_hold.release(session, held, cfg.dataset)
    except Exception as exc:  # the store went away: the mark stays on the tables for the next ingest
        log.warning("could not give compaction back on %s (%s); the next ingest of %s does", held, exc, cfg.dataset)


def choose_write_path(
    session: Any, cfg: CassandraIngestConfig, args: argparse.Namespace, splits: list[str]
) -> tuple[write_path.WritePath, BulkTarget | None]:
    """--write-path resolved (logged with its reason) and, for bulk and cql-helper, the helper's settings."""
    path = write_path.choose(session, args.write_path, manifest_rows(args.manifest_dir / workdir.MANIFEST))
    log.info("write path: %s (%s)", path.path, path.reason)
    if path.path == "cql-helper":
        try:
            return path, write_path.cql_helper_target(cfg.tables, splits, cfg.consistency, cfg.max_in_flight)
        except BulkLoadError as exc:  # auto's choice falls back; asked for, the job stops with the reason
            if args.write_path != "auto":
                raise
            path = write_path.WritePath("cql", f"auto: the helper could not be built ({exc}); cql")
            log.warning("write path: %s", path.reason)
            return path, None
    if path.path != "bulk":
        return path, None
    return path, write_path.bulk_target(session, cfg.tables, splits, cfg.consistency, args.storage_port)


def partitions_for(cfg: CassandraIngestConfig, spark: Any, manifest_dir: Path) -> int:
    """Spark partitions when --partitions is 0: the bulk path's fewer, larger ones; 0 (the default) for CQL."""
    if cfg.bulk is None or cfg.bulk.mode != "bulk":
        return 0
    rows = manifest_rows(manifest_dir / workdir.MANIFEST)
    return write_path.bulk_partitions(rows, parallelism(spark))


def ship_helper(spark: Any, target: BulkTarget) -> BulkTarget:
    """TARGET with the helper where executors find it: the driver's folder on a local master, else shipped by
    Spark as an archive it unpacks on every executor (SparkFiles), which may share nothing with this host; through
    Spark Connect, as an archive artifact of the session."""
    if not connected(spark) and spark.sparkContext.master.startswith("local"):
        return target
    archive = helper_archive(Path(target.helper))
    if connected(spark):
        spark.addArtifacts(str(archive), archive=True)
    else:
        spark.sparkContext.addArchive(str(archive))
    return replace(target, helper=f"sparkfiles:{archive.name}")


def record_scan_quarantine(session: Any, cfg: CassandraIngestConfig, scan_quarantine: QuarantineLog) -> None:
    """Files quarantined at scan time (no label) go to the quarantine table with the rest."""
    import uuid

    stmt = session.prepare(
        f"INSERT INTO {cfg.tables.keyspace}.quarantine (dataset, version, id, split, rel_path, reason, detail)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)"
    )
    for e in scan_quarantine.entries:
        session.execute(stmt, (cfg.dataset, cfg.version, uuid.UUID(e.id), e.split, e.path, e.reason, e.detail))


if __name__ == "__main__":
    prefer_installed_pyspark()  # spark-submit put Spark's source zip first: see imgest.spark.pypath
    sys.exit(main())
