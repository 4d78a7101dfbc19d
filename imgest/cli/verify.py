"""`imgest verify`: check stored data against the manifest."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from imgest.cli.common import add_cassandra_args, cassandra_settings
from imgest.core import defaults


def verify_cassandra_cmd(args: argparse.Namespace) -> int:
    import json

    from imgest.sinks.cassandra.client import cassandra_session, explain_unavailable
    from imgest.sinks.cassandra.schema import TableLayout
    from imgest.sinks.cassandra.verify import verify

    settings = cassandra_settings(args)
    tables = TableLayout(args.keyspace, args.table_layout, args.table_suffix)
    with cassandra_session(settings) as session, explain_unavailable(session):
        count_rows = getattr(args, "count_rows", False)  # `ingest cassandra --verify` has no such flag
        report = verify(
            session, args.manifest_dir, tables, args.dataset, args.version, args.sample, count_rows=count_rows
        )
    print(json.dumps(report.to_dict(), indent=2))
    if not report.ok:
        print("imgest: error: verification failed; the version is not marked complete", file=sys.stderr)
        return 1
    print(
        f"verified: {sum(report.found.values())} rows ({report.counts_from}) match the manifest; "
        f"{report.sampled} sampled rows are "
        f"byte-equal to a fresh transform; version {report.version} marked complete"
    )
    return 0


def _report(report: dict, what: str, ok_line: str, show: bool = True) -> int:
    import json

    if show:
        print(json.dumps(report, indent=2))
    if not report["ok"]:
        print(f"imgest: error: {what} verification failed", file=sys.stderr)
        return 1
    print(ok_line)
    return 0


def verify_files_cmd(args: argparse.Namespace) -> int:
    from imgest.core import defaults
    from imgest.sinks.files.verify import verify_files

    # `ingest files --verify` has none of these flags: the defaults apply
    sample = 0 if getattr(args, "full", False) else getattr(args, "files_sample", defaults.CHECK_SAMPLE)
    seed = getattr(args, "files_seed", defaults.CHECK_SAMPLE_SEED)
    result = verify_files(args.dest, sample, seed, getattr(args, "files_threads", 8))
    return _report(result.to_dict(), "files", f"verified: {result.summary()}; counts match the manifest")


def verify_shards_cmd(args: argparse.Namespace) -> int:
    from imgest.core.settings import s3_env

    s3_env(args.dest)
    if args.master:
        import tempfile

        log_file = Path(tempfile.mkdtemp(prefix="imgest-verify-")) / "spark-verify.log"
        report, rc = shards_on_spark(args.dest, args.master, log_file)  # the job printed its report
        if report is None:
            return rc
        return _report(report, "shard", "verified: every shard of manifest.json is present with its sha256", False)
    from imgest.sinks.shards.store import open_store
    from imgest.sinks.shards.verify import verify_shards

    report = verify_shards(open_store(args.dest), workers=args.workers).to_dict()
    return _report(report, "shard", "verified: every shard of manifest.json is present with its sha256")


def shards_on_spark(dest: str, master: str, log_file: Path, hash_kept: bool = True) -> tuple[dict | None, int]:
    """jobs/verify_shards.py through MASTER over DEST (HASH_KEPT False: kept shards by size and sidecars, a refresh's
    check), its output in LOG_FILE: (its report, 0), or (None, its exit code) saying why on stderr. A job that found
    a mismatch exits 1 after writing its report, which is then returned with the exit code."""
    import json

    from imgest.spark.failures import last_error_sentence
    from imgest.spark.submit import run_submit, submit_command

    summary = log_file.with_suffix(".json")
    summary.unlink(missing_ok=True)
    args = ["--dest", dest, "--summary-json", str(summary), *([] if hash_kept else ["--no-hash-kept"])]
    rc = run_submit(submit_command("verify_shards", args, master), log_file)
    report = json.loads(summary.read_text()) if summary.is_file() else None
    if rc != 0 and report is None:
        error = last_error_sentence(log_file) or f"the verification job failed (exit {rc})"
        print(f"imgest: error: {error}; log: {log_file}", file=sys.stderr)
    elif report is not None:
        kept = report.get("kept_unhashed", 0)
        print(f"shards: {report.get('shards')} checked on Spark ({kept} kept ones by size); log: {log_file}")
    return report, rc


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the top-level subparsers SUB."""
    verify = sub.add_parser("verify", help="check stored data against the manifest")
    verify_sub = verify.add_subparsers(dest="target", metavar="TARGET", required=True)
    vc = verify_sub.add_parser(
        "cassandra",
        help="counts per split and label, byte-equal samples, then mark the version complete",
        description="Counts per split and label (as the job recorded them, or counted in the table with "
        "--count-rows) must equal the manifest minus the quarantine, and a seeded, class-balanced sample of rows "
        "must be byte-equal to a fresh transform of its source.",
    )
    vc.add_argument("manifest_dir", type=Path, metavar="MANIFEST_DIR")
    vc.add_argument("--version", required=True, help="version printed by the ingest")
    vc.add_argument("--dataset", help="default: from the manifest")
    vc.add_argument("--keyspace", default="imgest")
    vc.add_argument("--table-layout", default="split-column", choices=["split-column", "per-split"])
    vc.add_argument("--table-suffix", default="")
    add_cassandra_args(vc)
    vc.add_argument("--sample", type=int, default=32, help="rows to byte-compare (default 32)")
    vc.add_argument(
        "--count-rows",
        action="store_true",
        help="count the version's rows in the table (a token-range scan of two columns) instead of trusting the "
        "counts the job recorded",
    )
    vc.set_defaults(func=verify_cassandra_cmd)

    vf = verify_sub.add_parser(
        "files",
        help="counts match manifest.json, every file is there with its size, a seeded sample (--full: every file) "
        "has its recorded sha256",
        description="Follows DEST/manifest.json to the published version folder. Counts per split of its "
        "samples.parquet must equal the manifest's, every listed file must be there with its recorded size (a stat "
        "each), and a seeded, class-balanced sample of each split must hash to its recorded sha256 (--full: every "
        "file). The report says the sample size and whether every file was hashed.",
    )
    vf.add_argument("dest", type=Path, metavar="DEST", help="folder of the files dataset")
    vf.add_argument(
        "--sample",
        dest="files_sample",
        type=int,
        metavar="N",
        default=defaults.CHECK_SAMPLE,
        help=f"files per split to hash (default {defaults.CHECK_SAMPLE}; 0: every file, like --full)",
    )
    vf.add_argument("--full", action="store_true", help="hash every file (reads every byte of the dataset)")
    vf.add_argument(
        "--seed",
        dest="files_seed",
        type=int,
        metavar="SEED",
        default=defaults.CHECK_SAMPLE_SEED,
        help="seed of the sample (same seed, same files)",
    )
    vf.add_argument(
        "--threads",
        dest="files_threads",
        type=int,
        default=8,
        metavar="N",
        help="stat / read calls in flight (default 8)",
    )
    vf.set_defaults(func=verify_files_cmd)
    vs = verify_sub.add_parser(
        "shards",
        help="every shard listed in manifest.json is there with its size and sha256",
        description="Reads DEST/manifest.json (s3://bucket/prefix or a folder), streams and hashes every shard it "
        "lists (--workers at a time, 1 MiB chunks) and checks each one's size, sha256 and sidecars.",
    )
    vs.add_argument("dest", metavar="DEST", help="s3://bucket/prefix or a folder")
    vs.add_argument("--workers", type=int, default=8, help="shards hashed at once here (default 8)")
    vs.add_argument(
        "--master",
        help="verify on Spark's executors instead (jobs/verify_shards.py): spark://host:7077, k8s://..., yarn, "
        "sc://host:15002 or local[N]; default: in this process",
    )
    vs.set_defaults(func=verify_shards_cmd)
