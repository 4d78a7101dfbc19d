"""`imgest ingest`: scan if needed, then spark-submit an ingest job."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from imgest.cli.common import add_source_args, add_transform_args, credentials_env, manifest_dir, run_command
from imgest.cli.refresh import add_wait_lock, locked_ingest
from imgest.core import workdir
from imgest.core.settings import s3_env


def _submit(
    args: argparse.Namespace,
    job: str,
    target: str,
    groups: list,
    extra: list[str],
    failed: str,
    beside_scan: bool = False,
) -> int:
    """Scan if needed, spark-submit JOB with the forwarded option GROUPS; returns the exit code. BESIDE_SCAN: JOB
    takes --wait-for-scan, so on a local master it starts while SRC is scanned (scan_handoff) instead of after (a
    cluster's executors would sit idle through a long scan)."""
    from imgest.cli.common import scan_dir, scan_into
    from imgest.spark.failures import last_error_sentence
    from imgest.spark.job_options import TRANSFORM_OPTIONS, forward
    from imgest.spark.submit import run_submit, submit_command

    use_source_connection(args)
    scanned = (args.src / workdir.MANIFEST).is_file()
    work = args.src if scanned else scan_dir(args)
    summary = work / workdir.job_summary(target)
    job_args = ["--manifest-dir", str(work), "--summary-json", str(summary), *extra]
    for group in (*groups, TRANSFORM_OPTIONS):
        job_args += forward(args, group)
    log_file = work / f"spark-{target}.log"
    if scanned or not beside_scan or not args.master.startswith("local"):
        manifest_dir(args)
        rc = run_submit(submit_command(job, job_args, args.master), log_file)
    else:
        rc = _submit_beside_scan(args, work, job, job_args, log_file, scan_into)
    if rc != 0:
        sentence = last_error_sentence(log_file) or f"the Spark job failed (exit {rc})"
        print(f"imgest: error: {sentence}", file=sys.stderr)
        print(f"imgest: the Spark job exited {rc}; {failed}; full log: {log_file}", file=sys.stderr)
        return rc
    print(f"summary written to {summary}")
    args.manifest_dir = work
    return 0


def _submit_beside_scan(
    args: argparse.Namespace, work: Path, job: str, job_args: list[str], log_file: Path, scan: Any
) -> int:
    """spark-submit JOB on a thread while this one scans SRC into WORK; the job reads the manifest once the scan is
    done. A failed scan is raised here once the job, told of it, has stopped (it writes nothing before the scan)."""
    from concurrent.futures import ThreadPoolExecutor

    from imgest.spark.scan_handoff import ScanHandoff
    from imgest.spark.submit import run_submit, submit_command

    handoff = ScanHandoff(work)
    cmd = submit_command(job, [*job_args, "--wait-for-scan", str(handoff.marker)], args.master)
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="imgest-submit") as pool:
            submitted = pool.submit(run_submit, cmd, log_file)
            try:
                scan(args, work)
            except BaseException as exc:
                handoff.failed(exc)
                submitted.exception()  # the job stops before the store; its log says why
                raise
            handoff.done()
            return submitted.result()
    finally:
        handoff.remove()


def add_source_conn_arg(p: argparse.ArgumentParser) -> None:
    """--source-conn-id: the Airflow connection of an s3:// source, as the DAG's source_conn_id."""
    p.add_argument(
        "--source-conn-id",
        metavar="CONN_ID",
        help="for an s3:// SRC: the Airflow connection (Amazon Web Services; endpoint_url extra, keys, region) that "
        "reads it, found as AIRFLOW_CONN_<CONN_ID> or in Airflow's database, as the DAG's source_conn_id (default: "
        "IMGEST_SOURCE_S3_ENDPOINT and IMGEST_SOURCE_AWS_* variables, else the destination's)",
    )


def use_source_connection(args: argparse.Namespace) -> None:
    """Read the s3:// source with --source-conn-id's connection: in this process (the scan) and, through the
    IMGEST_SOURCE_* variables spark-submit inherits, in the Spark driver, which ships it to the executors."""
    conn_id = getattr(args, "source_conn_id", None)
    if not conn_id:
        return
    from imgest.core.errors import ConfigError
    from imgest.sources.manifest import manifest_metadata
    from imgest.sources.s3source import is_s3, register_source, s3_url, source_env

    manifest = args.src / workdir.MANIFEST
    root = manifest_metadata(manifest)["root"] if manifest.is_file() else str(args.src)
    if not is_s3(root):
        raise ConfigError(f"--source-conn-id {conn_id} names the connection of an s3:// source, but {root} is local")
    try:
        from airflow.exceptions import AirflowNotFoundException

        from imgest.operators.hooks import ImgestS3Hook, source_settings
    except ImportError as exc:
        raise ConfigError(
            f"--source-conn-id reads an Airflow connection and Airflow cannot be imported here ({exc}); set "
            "IMGEST_SOURCE_S3_ENDPOINT, IMGEST_SOURCE_AWS_ACCESS_KEY_ID and IMGEST_SOURCE_AWS_SECRET_ACCESS_KEY instead"
        ) from None
    try:
        ImgestS3Hook.get_connection(conn_id)  # the provider would fall back to boto3's chain for a missing one
        settings = source_settings(s3_url(root), conn_id)
    except AirflowNotFoundException:
        raise ConfigError(
            f"--source-conn-id: no Airflow connection {conn_id!r}; add it (airflow connections add, or the "
            f"AIRFLOW_CONN_{conn_id.upper()} variable) or leave the option out"
        ) from None
    if settings is None:
        raise ConfigError(f"--source-conn-id {conn_id}: {root} is not an s3:// source")
    register_source(s3_url(root), settings)
    os.environ.update(source_env(settings))


def ingest_cassandra_cmd(args: argparse.Namespace) -> int:
    import json

    from imgest.spark.job_options import CASSANDRA_OPTIONS

    credentials_env(args)  # (checked before the lock in the keyspace was taken: _preflight_cassandra)
    failed = "re-running resumes where it stopped"
    rc = _submit(args, "ingest_cassandra", "cassandra", [CASSANDRA_OPTIONS], [], failed, beside_scan=True)
    if rc != 0 or not args.verify:
        return rc
    args.version = json.loads((args.manifest_dir / workdir.CASSANDRA_SUMMARY).read_text())["version"]
    from imgest.cli.verify import verify_cassandra_cmd

    return verify_cassandra_cmd(args)


def _preflight_cassandra(args: argparse.Namespace) -> None:
    """Names, replication and credentials, checked before the scan and spark-submit (one clear line each)."""
    from imgest.cli.common import cassandra_settings
    from imgest.flow.preflight import check_cassandra, check_tables

    check_tables(args.keyspace, args.table_layout, args.table_suffix or "", args.replication)
    check_cassandra(cassandra_settings(args))


def check_shards_dest(args: argparse.Namespace) -> None:
    """The destination answers these credentials (before the lock beside it is taken)."""
    from imgest.flow.preflight import check_shard_dest

    s3_env(args.dest)
    check_shard_dest(args.dest)


def ingest_shards_cmd(args: argparse.Namespace) -> int:
    from imgest.spark.job_options import SHARD_OPTIONS

    failed = "nothing was published and re-running resumes"
    return _submit(args, "pack_shards", "shards", [SHARD_OPTIONS], ["--dest", args.dest], failed)


def ingest_files_cmd(args: argparse.Namespace) -> int:
    from imgest.spark.job_options import FILES_OPTIONS

    dest = str(args.dest.resolve())
    rc = _submit(args, "write_files", "files", [FILES_OPTIONS], ["--dest", dest], "nothing was published")
    if rc != 0 or not args.verify:
        return rc
    from imgest.cli.verify import verify_files_cmd

    args.dest = Path(dest)
    return verify_files_cmd(args)


def run_ingest(argv: Sequence[str]) -> int:
    """`imgest ARGV...` for an `imgest ingest` command (ARGV starts with "ingest"), run in this process as the
    command line runs it (the same parser, logging and error handling); returns its exit status. What the
    benchmarks store their datasets with: the CLI hands it to them."""
    parser = argparse.ArgumentParser(prog="imgest")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    register(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    return run_command(parser, argv)


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the top-level subparsers SUB."""
    ingest = sub.add_parser(
        "ingest",
        help="run a Spark ingest job (cassandra, shards or files)",
        description="Scan SRC if needed, then spark-submit the ingest job.",
    )
    ingest_sub = ingest.add_subparsers(dest="target", metavar="TARGET", required=True)
    ic = ingest_sub.add_parser(
        "cassandra",
        help="ingest into Cassandra data/metadata tables",
        description="Idempotent and resumable: ids are deterministic and committed rows with the same source hash "
        "are skipped. Credentials: --user and --password-file, or IMGEST_CASSANDRA_USER / IMGEST_CASSANDRA_PASSWORD.",
    )
    add_source_args(ic)
    add_source_conn_arg(ic)
    add_wait_lock(ic)
    ic.add_argument("--user", help="Cassandra user")
    ic.add_argument("--password-file", help="file holding the Cassandra password")
    ic.add_argument("--verify", action="store_true", help="run imgest verify cassandra afterwards")
    ic.add_argument("--sample", type=int, default=32, help="rows byte-compared by --verify (default 32)")
    from imgest.spark.job_options import CASSANDRA_OPTIONS, add_options

    add_options(ic, CASSANDRA_OPTIONS)
    add_transform_args(ic)
    ic.set_defaults(func=locked_ingest(ingest_cassandra_cmd, _preflight_cassandra))  # checked, then the lock

    ish = ingest_sub.add_parser(
        "shards",
        help="pack webdataset shards (+ DALI .idx) to s3://bucket/prefix or a folder",
        description="Global seeded shuffle, shards cut by --max-count and --max-bytes, named {split}-{index:06d}.tar, "
        "each with a DALI index and a sha256, written once under DEST/v/<key>/ and published by writing manifest.json. "
        "S3 endpoint and keys: IMGEST_S3_ENDPOINT (none: AWS S3), AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / "
        "AWS_SESSION_TOKEN or botocore's chain (profiles, roles, SSO); the embedded server's: "
        'eval "$(imgest services env)".',
    )
    add_source_args(ish)
    add_source_conn_arg(ish)
    add_wait_lock(ish)
    ish.add_argument("--dest", required=True, help="s3://bucket/prefix or a local folder")
    from imgest.spark.job_options import SHARD_OPTIONS

    add_options(ish, SHARD_OPTIONS)
    add_transform_args(ish)
    ish.set_defaults(func=locked_ingest(ingest_shards_cmd, check_shards_dest))

    ifl = ingest_sub.add_parser(
        "files",
        help="write transformed images as DEST/<split>/<wnid>/<id>.jpg (the tree fn.readers.file reads)",
        description="The baseline every reader is compared with, and the input of `imgest validate xnvme`. Files are "
        "staged under DEST/_staging/<key>/, renamed to the version folder DEST/v/<key>/ (with its samples.parquet: "
        "id, path, label, split, wnid, bytes, sha256) and published by replacing DEST/manifest.json, which names "
        "it; the previous version stays until `imgest gc files`. DEST must be on storage every Spark node sees.",
    )
    add_source_args(ifl)
    add_source_conn_arg(ifl)
    add_wait_lock(ifl)
    ifl.add_argument("--dest", type=Path, required=True, help="folder of the files dataset")
    ifl.add_argument("--verify", action="store_true", help="run imgest verify files afterwards")
    from imgest.spark.job_options import FILES_OPTIONS

    add_options(ifl, FILES_OPTIONS)
    add_transform_args(ifl)
    ifl.set_defaults(func=locked_ingest(ingest_files_cmd))
