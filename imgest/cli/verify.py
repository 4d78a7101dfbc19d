"""`imgest verify`: check stored data against the manifest."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from imgest.cli.common import add_cassandra_args, cassandra_settings


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


def _report(report: dict, what: str, ok_line: str) -> int:
    import json

    print(json.dumps(report, indent=2))
    if not report["ok"]:
        print(f"imgest: error: {what} verification failed", file=sys.stderr)
        return 1
    print(ok_line)
    return 0


def verify_files_cmd(args: argparse.Namespace) -> int:
    from imgest.sinks.files.verify import verify_files

    report = verify_files(args.dest).to_dict()
    return _report(report, "files", f"verified: {report['files']} files match their sha256 and the manifest counts")


def verify_shards_cmd(args: argparse.Namespace) -> int:
    from imgest.cli.common import s3_env
    from imgest.sinks.shards.store import open_store
    from imgest.sinks.shards.verify import verify_shards

    s3_env(args.dest)
    report = verify_shards(open_store(args.dest)).to_dict()
    return _report(report, "shard", "verified: every shard of manifest.json is present with its sha256")


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
        help="every file of a files dataset has its recorded sha256; counts match manifest.json",
        description="Hashes every file listed in DEST/samples.parquet and compares counts per split with the manifest.",
    )
    vf.add_argument("dest", type=Path, metavar="DEST", help="folder of the files dataset")
    vf.set_defaults(func=verify_files_cmd)
    vs = verify_sub.add_parser(
        "shards",
        help="every shard listed in manifest.json is there with its sha256",
        description="Reads DEST/manifest.json (s3://bucket/prefix or a folder) and checks each shard's sha256.",
    )
    vs.add_argument("dest", metavar="DEST", help="s3://bucket/prefix or a folder")
    vs.set_defaults(func=verify_shards_cmd)
