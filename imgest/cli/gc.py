"""`imgest gc`: remove what a published dataset no longer needs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _keep(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative: give 0 (only the current version) or more")
    return value


def gc_files_cmd(args: argparse.Namespace) -> int:
    from imgest.sinks.files.gc import collect_files

    report = collect_files(args.dest, keep=args.keep, dry_run=args.dry_run)
    print(json.dumps(report.to_dict(), indent=2))
    verb = "would remove" if args.dry_run else "removed"
    print(f"{verb} {len(report.removed)} folders; kept {', '.join(report.kept) or 'none'} (current {report.current})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the top-level subparsers SUB."""
    gc = sub.add_parser("gc", help="remove old versions and stale staging of a published dataset")
    gc_sub = gc.add_subparsers(dest="target", metavar="TARGET", required=True)
    gf = gc_sub.add_parser(
        "files",
        help="remove version folders of a files dataset that its manifest no longer names, and stale staging",
        description="Keeps the version DEST/manifest.json names and the --keep most recent earlier ones (the "
        "manifest's history); removes every other folder under DEST/v/ and what failed or finished jobs left under "
        "DEST/_staging/. Staging a running job holds (its lock) is left alone. Readers of a removed version fail: "
        "keep as many as may still be read.",
    )
    gf.add_argument("dest", type=Path, metavar="DEST", help="folder of the files dataset")
    gf.add_argument(
        "--keep",
        type=_keep,
        default=1,
        metavar="N",
        help="earlier versions to keep besides the current one (default 1)",
    )
    gf.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    gf.set_defaults(func=gc_files_cmd)
    register_shards(gc_sub)


def gc_shards_cmd(args: argparse.Namespace) -> int:
    from imgest.core.settings import s3_env
    from imgest.sinks.shards.gc import collect
    from imgest.sinks.shards.store import open_store

    s3_env(args.dest)
    report = collect(open_store(args.dest), keep=args.keep, dry_run=args.dry_run, min_age=args.min_age)
    print(json.dumps(report.to_dict(), indent=2))
    verb = "would delete" if args.dry_run else "deleted"
    print(
        f"gc: {verb} {report.deleted} objects ({report.deleted_bytes} bytes); kept the objects of "
        f"{len(report.kept)} manifests ({', '.join(report.kept)}); {report.too_young} unreferenced objects are "
        "younger than --min-age and were left"
    )
    return 0


def register_shards(gc_sub: argparse._SubParsersAction) -> None:
    """Add `imgest gc shards` to the `gc` subparsers GC_SUB."""
    from imgest.sinks.shards.gc import DEFAULT_KEEP, DEFAULT_MIN_AGE_S

    gs = gc_sub.add_parser(
        "shards",
        help="delete superseded shards of a shard dataset (keeps the live version and --keep before it)",
        description=(
            "Each pack run writes its shards under DEST/v/<key>/ and publishes by writing DEST/manifest.json; "
            "nothing is deleted at publish, so older versions stay readable. This command deletes every object "
            "under DEST/v/ and DEST/_staging/ that neither the live manifest.json nor the --keep manifests "
            "published before it (kept as DEST/manifests/<key>.json) name, and the manifests/ copies of versions "
            "no longer kept. It never deletes what the live manifest names. On S3 it lists with pagination and "
            "deletes with DeleteObjects, 1000 keys a request."
        ),
        epilog="example: imgest gc shards s3://imgest/imagenet --keep 2 --dry-run",
    )
    gs.add_argument("dest", metavar="DEST", help="s3://bucket/prefix or a folder holding manifest.json")
    gs.add_argument(
        "--keep",
        type=_keep,
        default=DEFAULT_KEEP,
        metavar="N",
        help=f"also keep the objects of the N manifests published before the live one (default {DEFAULT_KEEP})",
    )
    gs.add_argument("--dry-run", action="store_true", help="report what would be deleted; delete nothing")
    gs.add_argument(
        "--min-age",
        type=float,
        default=DEFAULT_MIN_AGE_S,
        metavar="SECONDS",
        help="leave unreferenced objects younger than this: a pack job may be writing a version no manifest "
        f"names yet (default {DEFAULT_MIN_AGE_S:.0f}, a day; 0 when no pack job can be running on DEST)",
    )
    gs.set_defaults(func=gc_shards_cmd)
