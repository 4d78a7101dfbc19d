"""`imgest datasets`, `imgest refresh` and `imgest locks`: registered datasets, their refreshes, write locks."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from imgest.core import workdir


def datasets_list_cmd(args: argparse.Namespace) -> int:
    from imgest.flow.refresh import read_state
    from imgest.flow.registry import load_registry

    registry = load_registry(args.file)
    print(f"datasets file: {registry.path}{'' if registry.path.is_file() else ' (missing: no dataset registered)'}")
    for e in registry.entries:
        print(f"  refresh_{e.name:<24} schedule {e.schedule or 'none':<12} targets {','.join(e.targets)}")
        for target in e.targets:
            state = read_state(e.name, target)
            last = f"{state['version']} ({state['completed_at']}): {state['counts']}" if state else "never refreshed"
            print(f"      {target:<10} {last}")
    for problem in registry.errors:
        print(f"  ERROR {problem}", file=sys.stderr)
    return 1 if registry.errors else 0


def refresh_cmd(args: argparse.Namespace) -> int:
    from imgest.core.locks import dataset_lock
    from imgest.flow.registry import load_registry

    entry = load_registry(args.file).entry(args.name)
    targets = [args.target] if args.target else list(entry.targets)
    from imgest.cli.common import cli_run_state
    from imgest.flow.steps import s3_destination

    dests = [d for d in (s3_destination(entry.conf(t)) for t in targets) if d]
    with (
        cli_run_state(args.master, dests[0] if dests else None, _tables_lock(entry, targets)),  # the lock's stores
        dataset_lock(entry.name, f"imgest refresh {entry.name}", args.wait_lock),
    ):
        from imgest.flow.steps import scan_step

        scanned = scan_step(entry.conf(targets[0]))
        print(f"scan: {scanned['summary']}", flush=True)
        for target in targets:
            rc = _refresh_target(entry.conf(target), Path(scanned["manifest_dir"]), args.master)
            if rc:
                return rc
    return 0


def _tables_lock(entry: Any, targets: list[str]) -> str | None:
    """The lock store in the keyspace a refresh of ENTRY's TARGETS writes (the environment's cluster), or None."""
    if "cassandra" not in targets:
        return None
    from imgest.core.lock_stores import cassandra_lock_url, use_cassandra
    from imgest.core.settings import CassandraSettings
    from imgest.flow.request import IngestRequest

    request, settings = IngestRequest.from_conf(entry.conf("cassandra")), CassandraSettings.from_env()
    use_cassandra(settings)
    return cassandra_lock_url(settings, request.keyspace, request.replication)


def _refresh_target(conf: dict[str, Any], manifest_dir: Path, master: str) -> int:
    from imgest.core.settings import CassandraSettings, S3Settings, s3_env
    from imgest.flow.refresh import finish_refresh, plan_refresh
    from imgest.flow.request import IngestRequest
    from imgest.spark.failures import last_error_sentence
    from imgest.spark.submit import run_submit, submit_command

    request = IngestRequest.from_conf(conf)
    cassandra = CassandraSettings.from_env() if request.target == "cassandra" else None  # shards need none
    plan = plan_refresh(conf, manifest_dir, cassandra if request.target == "cassandra" else None)
    print(f"{request.target}: {json.dumps(plan['counts'])}", flush=True)
    if not plan["changed"]:
        print(f"{request.target}: no change since version {plan['version']}; nothing to do")
        return 0
    args = list(plan["job_args"])
    if cassandra is not None:
        job = "ingest_cassandra"
        args += ["--hosts", ",".join(cassandra.hosts), "--port", str(cassandra.port)]
        from imgest.flow.steps import prepare_cassandra

        prepare_cassandra(conf, manifest_dir, cassandra)
    else:
        job = "pack_shards"
        s3_env(request.shard_dest)
    log_file = manifest_dir / f"spark-refresh-{request.target}.log"
    rc = run_submit(submit_command(job, args, master), log_file)
    if rc != 0:
        print(f"imgest: error: {last_error_sentence(log_file) or f'the Spark job failed (exit {rc})'}", file=sys.stderr)
        print(f"imgest: the baseline is unchanged; re-running redoes version {plan['version']}; log: {log_file}")
        return rc
    s3 = S3Settings.from_env() if request.shard_dest.startswith("s3://") else None
    verified = None
    if cassandra is None:  # the new shards hashed on Spark's executors, as the refresh DAG's shards.verify does
        from imgest.cli.verify import shards_on_spark

        log_file = manifest_dir / "spark-refresh-verify.log"
        verified, rc = shards_on_spark(request.shard_dest, master, log_file, hash_kept=False)
        if rc != 0:
            print(f"imgest: the baseline is unchanged; re-running redoes version {plan['version']}", file=sys.stderr)
            return rc
    result = finish_refresh(conf, manifest_dir, cassandra, s3, verified)
    print(f"{request.target}: version {result['version']} complete: {json.dumps(result['counts'])}")
    return 0


def locks_cmd(args: argparse.Namespace) -> int:
    from imgest.core import locks
    from imgest.core.lock_stores import default_stores, lock_url_for, stores_at

    url = lock_url_for(args.dest, _cassandra_lock(args, args.keyspace) if args.keyspace else None)
    store = stores_at(url) if url else default_stores()
    if args.action == "release":
        if not args.dataset:
            print("imgest: error: name the dataset whose lock to release", file=sys.stderr)
            return 2
        freed = locks.release(args.dataset, store=store)
        print(f"{args.dataset}: {'released' if freed else 'was not locked'} (lock store {store.location})")
        return 0
    held = locks.held(store)
    print(f"lock store {store.location}: {len(held)} held")
    for dataset, lock in held.items():
        stale = f"  [stale: {lock.why_stale()}]" if lock.stale() else ""
        print(f"{dataset:<24} {lock.holder.who} (since {lock.holder.since}){stale}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the top-level subparsers SUB."""
    from imgest.spark.submit import LOCAL_MASTER

    ds = sub.add_parser(
        "datasets",
        help="list the registered datasets (the datasets file) and their last refresh",
        description="Reads $IMGEST_DATASETS_FILE (default $IMGEST_HOME/datasets.toml); exits 1 when an entry is "
        "malformed, naming the entry and the field.",
    )
    ds.add_argument("--file", type=Path, help="datasets file (default: $IMGEST_DATASETS_FILE)")
    ds.set_defaults(func=datasets_list_cmd)

    rf = sub.add_parser(
        "refresh",
        help="incremental refresh of a registered dataset (what its refresh_<name> DAG runs)",
        description="Scan again, compare with the last complete version; ingest added and changed images, remove "
        "removed ones, verify and record a new version. No change: no Spark job, no new version.",
    )
    rf.add_argument("name", help="dataset name (an entry of the datasets file)")
    rf.add_argument("--target", choices=["cassandra", "shards"], help="only this target (default: all of the entry)")
    rf.add_argument("--file", type=Path, help="datasets file (default: $IMGEST_DATASETS_FILE)")
    rf.add_argument("--master", default=LOCAL_MASTER, help=f"Spark master (default {LOCAL_MASTER})")
    add_wait_lock(rf)
    rf.set_defaults(func=refresh_cmd)

    lk = sub.add_parser(
        "locks",
        help="list or release the per-dataset write locks",
        description="A dataset is written by one run at a time (CLI or DAG). `release` frees a lock whose holder is "
        "gone (a CLI holder whose process died is freed automatically).",
    )
    lk.add_argument("action", choices=["list", "release"], nargs="?", default="list")
    lk.add_argument("dataset", nargs="?", help="dataset whose lock to release")
    lk.add_argument(
        "--dest",
        help="the locks of datasets written to this s3:// destination (kept in its bucket's _imgest-state unless "
        "$IMGEST_STATE_URL says otherwise); default: $IMGEST_STATE_URL, else this machine's",
    )
    lk.add_argument(
        "--keyspace",
        help="the locks of datasets written to this Cassandra keyspace (its imgest_locks table; the cluster from "
        "--hosts or $IMGEST_CASSANDRA_HOSTS)",
    )
    from imgest.cli.common import add_cassandra_args

    add_cassandra_args(lk)
    lk.set_defaults(func=locks_cmd)


def _cassandra_lock(args: argparse.Namespace, keyspace: str, replication: str | None = None) -> str:
    """The lock store in KEYSPACE of the cluster the command's flags name (the command's settings also reach it)."""
    from imgest.cli.common import cassandra_settings
    from imgest.core.lock_stores import cassandra_lock_url, use_cassandra

    settings = cassandra_settings(args)
    use_cassandra(settings)
    return cassandra_lock_url(settings, keyspace, replication)


def add_wait_lock(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--wait-lock",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="when another run writes the same dataset, wait up to SECONDS for it (default 0: refuse at once)",
    )


def locked_ingest(fn: Any, preflight: Any = None) -> Any:
    """Run an `imgest ingest` command holding its dataset's write lock; PREFLIGHT(args) first, before the lock is
    taken (a destination whose keys are refused is named as such, not as a lock store that refused them)."""

    def run(args: argparse.Namespace) -> int:
        if preflight is not None:
            preflight(args)
        from imgest.core.locks import dataset_lock
        from imgest.sources.manifest import manifest_metadata

        manifest = args.src / workdir.MANIFEST
        if args.dataset:
            dataset = args.dataset
        elif manifest.is_file():
            dataset = manifest_metadata(manifest)["dataset"]
        else:
            dataset = args.src.resolve().name
        from imgest.cli.common import cli_run_state

        tables = _cassandra_lock(args, args.keyspace, args.replication) if args.target == "cassandra" else None
        with (
            cli_run_state(args.master, str(getattr(args, "dest", "") or ""), tables),  # the lock's stores too
            dataset_lock(dataset, f"imgest ingest {args.target} {args.src}", args.wait_lock),
        ):
            return fn(args)

    return run
