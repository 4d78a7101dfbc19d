"""Spark job: write a scanned dataset as transformed files, DIR/<split>/<wnid>/<id>.jpg (fn.readers.file's tree).

    spark-submit --master local[*] jobs/write_files.py --manifest-dir DIR --dest /data/inet-files [options]

Usually started by `imgest ingest files` or the `ingest_imagenet` DAG (target: files). DEST must be on storage
every Spark node sees. The version is staged under DEST/_staging/<key>/ (each partition also writes its part of
samples.parquet, which the driver merges a batch at a time), renamed to DEST/v/<key>/ and published by replacing
DEST/manifest.json, the only commit (layout: imgest.sinks.files.layout).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from imgest.core import workdir
from imgest.core.errors import ImgestError
from imgest.core.locks import submitter_holdings
from imgest.core.quarantine import QuarantineLog
from imgest.core.staging import Stager
from imgest.sinks.cassandra.ingest import transform_key
from imgest.sinks.files.layout import parts_dir
from imgest.sinks.files.write import (
    FilesConfig,
    FilesPartResult,
    build_manifest,
    manifest_bytes,
    merge_parts,
    publish,
    staging,
    version_key,
    write_atomic,
    write_partition,
)
from imgest.sources.manifest import manifest_metadata, read_classes
from imgest.sources.s3source import shippable_root
from imgest.spark.failures import nothing_ingestible, report_failure
from imgest.spark.job_options import FILES_OPTIONS, TRANSFORM_OPTIONS, job_parser
from imgest.spark.manifest_rdd import Candidates, candidate_rdd, run_candidates
from imgest.spark.pypath import prefer_installed_pyspark
from imgest.spark.submit import emit_summary, job_logging, stop_session
from imgest.transform.image import TransformSpec

log = logging.getLogger("imgest.jobs.write_files")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = job_parser("write_files", __doc__, FILES_OPTIONS, TRANSFORM_OPTIONS)
    p.add_argument("--dest", type=Path, required=True, help="folder of the files dataset")
    return p.parse_args(argv)


def build_config(args: argparse.Namespace) -> FilesConfig:
    meta = manifest_metadata(args.manifest_dir / workdir.MANIFEST)
    spec = TransformSpec.from_args(args)
    dataset = args.dataset or meta["dataset"]
    key = version_key(args.manifest_dir / workdir.MANIFEST, dataset, spec)
    return FilesConfig(shippable_root(meta["root"]), dataset, str(args.dest.resolve()), spec, key)


def load(spark: Any, candidates: Candidates, cfg: FilesConfig) -> FilesPartResult:
    """Stage every image and each partition's part of samples.parquet; the driver gets one small summary per
    partition. Logs progress while it runs."""

    def partition(index: int, it: Any, on_image: Any) -> FilesPartResult:
        return write_partition(index, it, cfg, on_image)

    total = FilesPartResult()
    for part in run_candidates(spark, candidates, partition, log, "write"):
        total.merge(part)
    return total


def merge_samples(total: FilesPartResult, cfg: FilesConfig, staged: Path) -> None:
    """The partitions' parts merged into STAGED/samples.parquet, sorted by path; ImgestError when its rows are not
    the rows the partitions reported."""
    parts = [parts_dir(Path(cfg.dest), cfg.key) / name for name in sorted(total.parts)]
    stats = merge_parts(parts, staged / workdir.PUBLISHED_SAMPLES)
    log.info("samples.parquet: %d rows from %d parts in %d merge passes", stats.rows, len(parts), stats.passes)
    if stats.rows != total.rows:
        raise ImgestError(
            f"counts do not reconcile: the partitions wrote {total.rows} images but their parts of "
            f"{workdir.PUBLISHED_SAMPLES} hold {stats.rows} rows; nothing was published and a re-run starts again"
        )


@submitter_holdings()  # the lock its submitter holds: the driver fences its publishing with it
def main(argv: Sequence[str] | None = None) -> int:
    job_logging("py4j")
    args = parse_args(argv)
    try:
        cfg = build_config(args)
        Path(cfg.dest).mkdir(parents=True, exist_ok=True)
        from imgest.spark.submit import build_session

        spark = build_session("imgest-write-files")
        t0 = time.monotonic()
        stager = Stager.from_env(cfg.dataset)
        candidates = candidate_rdd(spark, args.manifest_dir, args.partitions, stager)
        rows = candidates.rows
        log.info("writing %d images of %s as files under %s (version folder %s)", rows, cfg.dataset, cfg.dest, cfg.key)
        with staging(Path(cfg.dest), cfg.key) as staged:
            with stager:
                total = load(spark, candidates, cfg)
            if total.rows + len(total.quarantine) != rows:
                raise ImgestError(
                    f"counts do not reconcile: {rows} manifest rows, {total.rows} written and "
                    f"{len(total.quarantine)} quarantined; nothing was published and a re-run starts again"
                )
            if not total.rows:
                raise nothing_ingestible(args.manifest_dir, "files", rows, total.quarantine)
            merge_samples(total, cfg, staged)
            scan_quarantine = QuarantineLog.read(args.manifest_dir / workdir.SCAN_QUARANTINE)
            version = f"t-{transform_key(cfg.spec)}"
            classes = read_classes(args.manifest_dir / workdir.CLASSES)
            manifest = build_manifest(total, cfg, version, classes, scan_quarantine)
            write_atomic(staged / workdir.PUBLISHED_MANIFEST, manifest_bytes(manifest))
            changes = publish(Path(cfg.dest), cfg.key, manifest)
        seconds = time.monotonic() - t0
        summary = {
            "dataset": cfg.dataset,
            "version": version,
            "dest": cfg.dest,
            "samples": manifest["samples"],
            "bytes": manifest["bytes"],
            "published": total.rows,
            **changes,
            "quarantined": manifest["quarantine"]["count"],
            "quarantined_by_reason": manifest["quarantine"]["by_reason"],
            "seconds": round(seconds, 2),
            "images_per_s": round(rows / seconds, 1),
        }
        emit_summary(summary, args.summary_json)
        stop_session(spark)
        return 0
    except Exception as exc:  # the job's last line is the sentence; the trace stays in the log
        return report_failure(log, "writing files", exc)


if __name__ == "__main__":
    prefer_installed_pyspark()  # spark-submit put Spark's source zip first: see imgest.spark.pypath
    sys.exit(main())
