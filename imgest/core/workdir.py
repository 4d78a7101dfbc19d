"""Every file of a work folder, named once.

A work folder (``<state>/work/<dataset>/`` for the DAG, ``--out`` for the CLI) holds what a scan found and
what each later step wrote about it. Steps refer to these names, never to bare strings.
"""

from __future__ import annotations

from pathlib import Path

from imgest.core.paths import state_dir

MANIFEST = "manifest.parquet"  # one row per candidate image (scan)
CLASSES = "classes.json"  # class map: wnid -> label, names (scan)
SCAN_QUARANTINE = "quarantine.json"  # what the scan could not take (scan)
SCAN_REPORT = "scan_report.json"  # counts per split, junk, problems (scan)
CHECK_REPORT = "check.json"  # dry run of the transform (imgest check)
SHARD_PLAN = "shard_plan.parquet"  # rows in shard order (pack job)
CASSANDRA_SUMMARY = "ingest_cassandra.json"  # the Cassandra job's summary: version, counts (ingest job)
SHARDS_SUMMARY = "pack_shards.json"  # the shard job's summary (pack job)
FILES_SUMMARY = "ingest_files.json"  # the files job's summary (files job)
READ_REPORT = "read_throughput.json"  # DALI read-back report (imgest check read)
READ_PLOT = "read_throughput.png"
XNVME_REPORT = "validate_xnvme.json"  # xNVMe validation report (imgest validate xnvme)
XNVME_PLOT = "validate_xnvme.png"
XNVME_BLOCK_MAP = "block_map.npz"  # numpy columns: paths, sizes, fallbacks, extents

# Files of a published shard or files dataset (in its destination, not in the work folder).
PUBLISHED_MANIFEST = "manifest.json"
PUBLISHED_SAMPLES = "samples.parquet"
PUBLISHED_SHARDS = "shards.parquet"  # per shard: samples per label, quarantined inputs, dead keys


def shard_index(shard: str) -> str:
    """The DALI index object beside SHARD ('train-000000.tar' -> 'train-000000.idx')."""
    return f"{shard.removesuffix('.tar')}.idx"


def shard_info(shard: str) -> str:
    """The sidecar object beside SHARD holding its label counts and quarantine list (too big for S3 metadata)."""
    return f"{shard.removesuffix('.tar')}.info.json"


def job_summary(target: str) -> str:
    """The summary file the ingest job of TARGET writes."""
    return {"cassandra": CASSANDRA_SUMMARY, "shards": SHARDS_SUMMARY, "files": FILES_SUMMARY}[target]


def job_quarantine(target: str) -> str:
    """The quarantine list the ingest job of TARGET writes when nothing was ingestible."""
    return f"quarantine-{target}.json"


def split_file(target: str) -> str:
    """The split file the DAG writes for TARGET."""
    return f"split-{target}.npz"


def dataset_workdir(dataset: str) -> Path:
    """The DAG's work folder of DATASET."""
    return state_dir() / "work" / dataset
