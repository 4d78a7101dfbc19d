"""Spark job: write a scanned dataset as transformed files, DIR/<split>/<wnid>/<id>.jpg (fn.readers.file's tree).

    spark-submit --master local[*] jobs/write_files.py --manifest-dir DIR --dest /data/inet-files [options]

Usually started by `imgest ingest files` or the `ingest_imagenet` DAG (target: files). DEST must be on storage
every Spark node sees. Files are staged under DEST/_staging/ and published together, manifest.json last.
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
from imgest.core.quarantine import QuarantineLog
from imgest.sinks.cassandra.ingest import transform_key
from imgest.sinks.files.write import FilesConfig, FilesPartResult, build_manifest, publish, write_partition
from imgest.sources.manifest import Candidate, manifest_metadata, read_classes
from imgest.spark.failures import nothing_ingestible, report_failure
from imgest.spark.job_options import FILES_OPTIONS, TRANSFORM_OPTIONS, job_parser
from imgest.spark.submit import emit_summary, manifest_frame, progress_log
from imgest.transform.image import TransformSpec

log = logging.getLogger("imgest.jobs.write_files")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = job_parser("write_files", __doc__, FILES_OPTIONS, TRANSFORM_OPTIONS)
    p.add_argument("--dest", type=Path, required=True, help="folder of the files dataset")
    return p.parse_args(argv)


def build_config(args: argparse.Namespace) -> FilesConfig:
    meta = manifest_metadata(args.manifest_dir / workdir.MANIFEST)
    spec = TransformSpec(args.mode, args.resize, args.crop, args.quality, args.max_pixels)
    return FilesConfig(meta["root"], args.dataset or meta["dataset"], str(args.dest.resolve()), spec)


def load(df: Any, cfg: FilesConfig, rows: int) -> FilesPartResult:
    """Stage every image from the partitions; log images/s and MB/s while it runs."""
    sc = df.sparkSession.sparkContext
    done, nbytes = sc.accumulator(0), sc.accumulator(0)

    def partition(it: Any) -> list[FilesPartResult]:
        def on_image(size: int) -> None:
            done.add(1)
            nbytes.add(size)

        return [write_partition((Candidate(**r.asDict()) for r in it), cfg, on_image)]

    with progress_log(log, "write", done, nbytes, rows):
        total = FilesPartResult()
        for part in df.rdd.mapPartitions(partition).collect():
            total.merge(part)
        return total


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    args = parse_args(argv)
    try:
        cfg = build_config(args)
        Path(cfg.dest).mkdir(parents=True, exist_ok=True)
        from imgest.spark.submit import build_session

        spark = build_session("imgest-write-files")
        t0 = time.monotonic()
        df, rows = manifest_frame(spark, args.manifest_dir, args.partitions)
        log.info("writing %d images of %s as files under %s", rows, cfg.dataset, cfg.dest)
        total = load(df, cfg, rows)
        if len(total.files) + len(total.quarantine) != rows:
            raise ImgestError(
                f"counts do not reconcile: {rows} manifest rows, {len(total.files)} written and "
                f"{len(total.quarantine)} quarantined; nothing was published and a re-run starts again"
            )
        if not total.files:
            raise nothing_ingestible(args.manifest_dir, "files", rows, total.quarantine)
        scan_quarantine = QuarantineLog.read(args.manifest_dir / workdir.SCAN_QUARANTINE)
        version = f"t-{transform_key(cfg.spec)}"
        classes = read_classes(args.manifest_dir / workdir.CLASSES)
        manifest = build_manifest(total, cfg, version, classes, scan_quarantine)
        changes = publish(Path(cfg.dest), total, manifest)
        seconds = time.monotonic() - t0
        summary = {
            "dataset": cfg.dataset,
            "version": version,
            "dest": cfg.dest,
            "samples": manifest["samples"],
            "bytes": manifest["bytes"],
            **changes,
            "quarantined": manifest["quarantine"]["count"],
            "quarantined_by_reason": manifest["quarantine"]["by_reason"],
            "seconds": round(seconds, 2),
            "images_per_s": round(rows / seconds, 1),
        }
        emit_summary(summary, args.summary_json)
        spark.stop()
        return 0
    except Exception as exc:  # the job's last line is the sentence; the trace stays in the log
        return report_failure(log, "writing files", exc)


if __name__ == "__main__":
    sys.exit(main())
