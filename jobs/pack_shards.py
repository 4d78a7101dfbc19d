"""Spark job: pack a scanned dataset into webdataset shards on S3 or in a folder.

    spark-submit --master local[*] jobs/pack_shards.py --manifest-dir DIR --dest s3://bucket/prefix [options]

Usually started by `imgest ingest shards` or the `ingest_imagenet` DAG. S3 credentials come from the
driver's environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, IMGEST_S3_ENDPOINT), never from arguments;
the driver ships them to executors inside the tasks. Shards are written once, to DEST/v/<key>/ (key: the
digest of the plan and transform), and published by writing DEST/manifest.json last, the only switch.
Executors read the shard plan from the work folder, or from object storage where IMGEST_STATE_URL stages it.
--read-order: each shard's task reads its samples where they lie ("plan"), or the source is read forward and
Spark's shuffle moves each sample to its shard ("source": imgest.sinks.shards.pack_ordered; "auto" picks it for
tar archives on S3).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from imgest.core import workdir
from imgest.core.errors import ConfigError, ImgestError
from imgest.core.locks import submitter_holdings
from imgest.core.quarantine import QuarantineLog
from imgest.core.settings import S3Settings
from imgest.core.staging import Staged, Stager
from imgest.sinks.shards.pack import pack_planned
from imgest.sinks.shards.pack_ordered import pack_in_source_order, source_order
from imgest.sinks.shards.pack_publish import (
    build_manifest,
    carry_published,
    marked_shards,
    plan_items,
    publish,
    samples_table,
)
from imgest.sinks.shards.pack_record import PackConfig, Published, ShardRecord
from imgest.sinks.shards.plan import ShardSpec, build_plan, take_plan
from imgest.sinks.shards.shard_table import shards_table
from imgest.sinks.shards.store import ShardStore, open_store
from imgest.sources.manifest import manifest_metadata, read_classes
from imgest.sources.s3source import shippable_root
from imgest.spark.failures import nothing_ingestible, report_failure
from imgest.spark.job_options import SHARD_OPTIONS, TRANSFORM_OPTIONS, job_parser
from imgest.spark.partitions import connected, parallelism, progress_log, run_partitions, run_rdd_partitions
from imgest.spark.pypath import prefer_installed_pyspark
from imgest.spark.submit import emit_summary, job_logging, stop_session
from imgest.transform.image import TransformSpec

log = logging.getLogger("imgest.jobs.pack_shards")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = job_parser("pack_shards", __doc__, SHARD_OPTIONS, TRANSFORM_OPTIONS)
    p.add_argument("--dest", required=True, help="s3://bucket/prefix or a local folder")
    p.add_argument("--plan", type=Path, help="use this shard plan (a refresh's) instead of planning the manifest")
    p.add_argument("--version-info", type=Path, help="JSON file recorded as manifest.json's 'version' (refresh)")
    return p.parse_args(argv)


def build_config(args: argparse.Namespace) -> PackConfig:
    meta = manifest_metadata(args.manifest_dir / workdir.MANIFEST)
    return PackConfig(
        root=shippable_root(meta["root"]),  # an S3 source's connection travels inside the tasks
        dataset=args.dataset or meta["dataset"],
        dest=args.dest,
        spec=TransformSpec.from_args(args),
        shards=ShardSpec(args.max_count, args.max_bytes, args.seed),
        s3=S3Settings.from_env().frozen() if args.dest.startswith("s3://") else None,
    )


def extract(args: argparse.Namespace, cfg: PackConfig) -> tuple[Path, list[tuple[str, int]], int, str]:
    """Plan the shards and write the plan, one Parquet row group per shard; returns (path, shards, rows, key):
    ROWS are the live rows (a refresh's plan also holds its kept shards' dead rows), KEY is the plan's content key,
    the version prefix v/<key>/ of the shards this run writes."""
    plan_path = (args.manifest_dir / workdir.SHARD_PLAN).resolve()
    if args.plan:  # a refresh's plan: copied as written (one row group per shard, its key beside it)
        plan = take_plan(args.plan, plan_path, cfg.spec)
    else:  # planned out of core: memory stays flat whatever the manifest's size
        plan = build_plan(args.manifest_dir / workdir.MANIFEST, plan_path, cfg.shards, cfg.spec)
    return plan_path, plan.shards, plan.live, plan.key


def shard_task(
    plan_path: Path | Staged, cfg: PackConfig
) -> Callable[[int, Iterator[tuple[str, int, Published]], Callable[[int], None]], list[ShardRecord]]:
    """The function every Spark task runs over its shards (index, its items, what to call per sample): what it
    pickles is the plan's place and the config; each shard's live entry comes with the shard, as the task's data."""

    def partition(
        index: int, it: Iterator[tuple[str, int, Published]], on_sample: Callable[[int], None]
    ) -> list[ShardRecord]:
        return pack_planned(plan_path, it, cfg, _store_factory(cfg), on_sample)

    return partition


def _counter(done: Any, nbytes: Any) -> Callable[[int], None]:
    """What a task calls per sample it wrote: adds to the accumulators DONE and NBYTES (None: not counted)."""

    def on_sample(size: int) -> None:
        if done is not None:
            done.add(1)
            nbytes.add(size)

    return on_sample


def _store_factory(cfg: PackConfig) -> Callable[[], ShardStore]:
    """Opens the destination inside a task (its S3 settings travel in CFG)."""
    return lambda: open_store(cfg.dest, cfg.s3)


def load(
    spark: Any,
    plan_path: Staged,
    items: list[tuple[str, int, Published]],
    cfg: PackConfig,
    rows: int,
    args: argparse.Namespace,
) -> list[ShardRecord]:
    """Write every shard of ITEMS (plan_items: each task reads its shards' row groups and gets their live entries as
    its data), in the plan's order (each shard reads its samples where they lie, no shuffle) or in the source's
    (pack_ordered); log progress while it runs."""
    log.info("reading the source in the %s's order", args.read_order)
    if args.read_order == "source":  # auto resolved by main
        if connected(spark):
            raise ConfigError(
                "--read-order source packs through an RDD shuffle, which Spark Connect does not run: use "
                "--read-order plan (each shard reads its own samples), or spark-submit for this source"
            )
        sc = spark.sparkContext
        done, nbytes = sc.accumulator(0), sc.accumulator(0)
        with progress_log(log, "pack", done, nbytes, rows):
            store_factory = _store_factory(cfg)
            return pack_in_source_order(sc, plan_path, items, cfg, store_factory, rows, _counter(done, nbytes))
    slices = max(1, min(len(items), args.partitions or 4 * parallelism(spark)))
    task = shard_task(plan_path, cfg)
    if not connected(spark):  # the items travel as the tasks' data, not inside the function every task gets
        return run_rdd_partitions(spark.sparkContext.parallelize(items, slices), task, log, "pack", rows)
    # Connect runs functions over rows: each task's items go inside the function (about 1 KB a shard: 1.3 MB at
    # ImageNet's 1,300 shards, more for a refresh's marked shards, which carry their detail)
    chunks = [items[i * len(items) // slices : (i + 1) * len(items) // slices] for i in range(slices)]
    return run_partitions(spark, slices, lambda i, on: task(i, iter(chunks[i]), on), log, "pack", rows)


def read_order(args: argparse.Namespace, cfg: PackConfig) -> str:
    """The order the job reads the source in, "plan" or "source" (--read-order, auto resolved)."""
    layout = manifest_metadata(args.manifest_dir / workdir.MANIFEST).get("layout", "")
    return "source" if source_order(args.read_order, cfg.root, layout) else "plan"


def _pack(
    spark: Any, args: argparse.Namespace, cfg: PackConfig, store: ShardStore, live: dict[str, Any] | None
) -> tuple[list[ShardRecord], Path, int, str, PackConfig]:
    """Plan, pack every shard, and fill in what the kept shards carry from the LIVE version: (records, plan path,
    live rows, key, the config with its key)."""
    plan_path, shards, rows, key = extract(args, cfg)
    cfg = dataclasses.replace(cfg, key=key)
    log.info("packing %d samples of %s into %d shards at %s/%s", rows, cfg.dataset, len(shards), store.location, key)
    items = plan_items(shards, live, store, marked_shards(plan_path))
    with Stager.from_env(cfg.dataset) as stager:  # executors elsewhere read the plan from the store
        records = load(spark, stager.stage(plan_path), items, cfg, rows, args)
    carry_published(records, live, store)
    return records, plan_path, rows, key, cfg


def _summary(
    order: str,
    cfg: PackConfig,
    location: str,
    records: list[ShardRecord],
    key: str,
    manifest: dict[str, Any],
    changed: bool,
    rows: int,
    seconds: float,
) -> dict[str, Any]:
    """The job's summary line: what was packed where, what was kept or resumed, and how fast."""
    return {
        "dataset": cfg.dataset,
        "dest": location,
        "read_order": order,
        "shards": len(records),
        "key": key,
        "previous": manifest["previous"],
        "shards_resumed": sum(r.reused == "resumed" for r in records),
        "shards_kept_published": sum(r.reused == "published" for r in records),
        "published": changed,
        "samples": manifest["samples"],
        "bytes": manifest["bytes"],
        "quarantined": manifest["quarantine"]["count"],
        "quarantined_by_reason": manifest["quarantine"]["by_reason"],
        "seconds": round(seconds, 2),
        "samples_per_s": round(rows / seconds, 1),
        "mb_per_s": round(manifest["bytes"] / 1e6 / seconds, 2),
    }


@submitter_holdings()  # the lock its submitter holds: the driver fences its publishing with it
def main(argv: Sequence[str] | None = None) -> int:
    job_logging("botocore", "boto3", "s3transfer", "urllib3", "py4j")
    args = parse_args(argv)
    try:
        store = open_store(args.dest)
        check = getattr(store, "check", None)
        if check is not None:
            check()  # wrong keys or bucket fail here, before any Spark work
        cfg, live = build_config(args), store.read_manifest()
        args.read_order = read_order(args, cfg)  # "auto" resolved once: the pack and the summary use it
        from imgest.spark.submit import build_session

        spark = build_session("imgest-pack-shards")
        t0 = time.monotonic()
        records, plan_path, rows, key, cfg = _pack(spark, args, cfg, store, live)
        scan_quarantine = QuarantineLog.read(args.manifest_dir / workdir.SCAN_QUARANTINE)
        manifest = build_manifest(records, cfg, read_classes(args.manifest_dir / workdir.CLASSES), scan_quarantine)
        if args.version_info:
            manifest["version"] = json.loads(args.version_info.read_text())
        packed = sum(r.samples for r in records) + len([q for r in records for q in r.quarantine])
        if packed != rows:
            raise ImgestError(
                f"counts do not reconcile: {rows} planned samples, {packed} packed or quarantined; "
                "nothing was published and a re-run resumes"
            )
        if sum(r.samples for r in records) == 0:
            quarantined = [q for r in records for q in r.quarantine]
            raise nothing_ingestible(args.manifest_dir, "shards", rows, quarantined)
        samples = samples_table(plan_path, records)  # streamed a shard's row group at a time
        changed = publish(store, manifest, samples, shards_table(records))
        seconds = time.monotonic() - t0
        summary = _summary(args.read_order, cfg, store.location, records, key, manifest, changed, rows, seconds)
        emit_summary(summary, args.summary_json)
        stop_session(spark)
        return 0
    except Exception as exc:  # the job's last line is the sentence; the trace stays in the log
        return report_failure(log, "packing", exc)


if __name__ == "__main__":
    prefer_installed_pyspark()  # spark-submit put Spark's source zip first: see imgest.spark.pypath
    sys.exit(main())
