"""Every default of an ingest, defined once.

The typed objects (TransformSpec, ShardSpec, TableLayout, IngestRequest), the Spark jobs' options, the CLI
and the DAG's Params all take their defaults from here.
"""

from __future__ import annotations

from typing import Final

IMAGE_MODE: Final = "jpeg"
RESIZE: Final = 256
CROP: Final = 224
QUALITY: Final = 90
MAX_PIXELS: Final = 100_000_000  # decompression-bomb limit

KEYSPACE: Final = "imgest"
TABLE_LAYOUT: Final = "split-column"
TABLE_SUFFIX: Final = ""
REPLICATION: Final = "SimpleStrategy:1"
CASSANDRA_PORT: Final = 9042
CONSISTENCY: Final = "LOCAL_QUORUM"  # writes and verify reads; IMGEST_CASSANDRA_CONSISTENCY, --consistency
CONSISTENCY_LEVELS: Final = ("ONE", "TWO", "THREE", "QUORUM", "ALL", "LOCAL_QUORUM", "EACH_QUORUM", "LOCAL_ONE")
MAX_IN_FLIGHT: Final = 64
MAX_IN_FLIGHT_BYTES: Final = 256 * 1024 * 1024  # image bytes in flight per CQL writer (ImageWriter, cql-helper)
REQUEST_TIMEOUT_S: Final = 30.0  # a CQL request's wait for its answer (both drivers)
MAX_BLOB_BYTES: Final = 31 * 1024 * 1024  # the embedded node accepts up to 32 MiB per mutation
# How rows reach Cassandra: cql (an UNLOGGED batch per image) or bulk (SSTables written by the executors and
# streamed to every replica); auto picks bulk for BULK_MIN_ROWS rows and more where the cluster can take them.
WRITE_PATHS: Final = ("auto", "bulk", "cql", "cql-helper")
WRITE_PATH: Final = "auto"
BULK_MIN_ROWS: Final = 20_000
BULK_ROWS_PER_PARTITION: Final = 20_000  # bulk: fewer, larger Spark partitions (each ends with a load: an SSTable)
BULK_ROUND_BYTES: Final = 256 * 1024 * 1024  # image bytes an executor writes to SSTables before streaming them
# Towards a partition's end its rounds shrink to half of what is left, down to this: the last round, streamed after
# the partition's last row with nothing to overlap, stays small. Every round leaves an SSTable per table that spans the
# whole ring, and a range read opens them all: at 16 MiB a 1.33 M-image load of small images left 268 per table (4 a
# partition of 20,000 rows), which took 945 of a 1 GiB node's direct memory under a split scan (docs/scale.md).
BULK_MIN_ROUND_BYTES: Final = 64 * 1024 * 1024
# Rows a helper sorts in memory before it writes an SSTable: more than a round, so a round is one SSTable per table
# (64 MiB made four, and the node compacted 16.1 GB at 1.33 M count21k images against 11.5 GB with one; 448 -> 438 s).
BULK_BUFFER_MIB: Final = 320
BULK_HEAP: Final = "1536m"  # the helper JVM's heap: a round's sort buffer plus the loader (committed as it fills)

SHARD_MAX_COUNT: Final = 5000
SHARD_MAX_BYTES: Final = 1 << 30
SHUFFLE_SEED: Final = 0

SPLIT_RATIOS: Final = "8,2"
SPLIT_BALANCE: Final = "original"
SPLIT_SEED: Final = 0

DATASET: Final = "imagenet-sample"
TARGET: Final = "cassandra"
LAYOUT: Final = "auto"
LAYOUTS: Final = ("auto", "cls-loc", "imagefolder", "flat", "tar")
TARGETS: Final = ("cassandra", "shards", "files")
IMAGE_MODES: Final = ("jpeg", "unchanged")
UNCHANGED_CHECK: Final = "decode"
UNCHANGED_CHECKS: Final = ("decode", "header")
TABLE_LAYOUTS: Final = ("split-column", "per-split")
SPARK_PARTITIONS: Final = 0  # automatic
TASK_MAX_FAILURES: Final = 4  # Spark's own default on clusters; local masters get it as local[N,F]
LOCAL_MASTER: Final = f"local[*,{TASK_MAX_FAILURES}]"


BUCKET_ENV: Final = "IMGEST_S3_BUCKET"


def shard_dest(dataset: str, bucket: str | None = None) -> str:
    """Where a dataset's shards go when no destination is given: s3://BUCKET/<dataset>, BUCKET (the connection's
    extra ``bucket``) else $IMGEST_S3_BUCKET. No bucket is a default: without either, a ConfigError says what to set."""
    import os

    bucket = bucket or os.environ.get(BUCKET_ENV)
    if not bucket:
        from imgest.core.errors import ConfigError

        raise ConfigError(
            f"no shard destination for {dataset!r}: give s3_dest (--dest), the AWS connection's extra "
            f'{{"bucket": ...}} or {BUCKET_ENV}'
        )
    return f"s3://{bucket}/{dataset}"


def files_dest(dataset: str) -> str:
    """Where a dataset's files target goes when no destination is given: <state>/files/<dataset>."""
    from imgest.core.paths import state_dir

    return str(state_dir() / "files" / dataset)


# Checks after an ingest or refresh (read-back, xNVMe) read a seeded, class-balanced sample of this many images;
# 0 reads every row (an explicit choice: at ImageNet's count that is hours, not seconds).
CHECK_SAMPLE: Final = 10_000
CHECK_SAMPLE_SEED: Final = 0
# The read-back check's time budget (docs/readback.md, "The time budget"): the whole check (choosing the sample, every
# reader in each mode, the report) in CHECK_SECONDS, and inside a DAG run of CHECK_SHARE_FROM_IMAGES train images or
# more at most CHECK_RUN_SHARE of the run (below that 10 % of the run buys no measurement). Each reader's first
# CHECK_WARMUP_BATCHES batches are its start-up; its steady rate is measured over the batches after them, and is a
# rate only over at least CHECK_WINDOW_BATCHES of them, which it reads whatever its share (the window sizes: the
# spread of the rate against the window, `imgest bench read --check-fidelity`). Every image read is verified; 0
# seconds: no budget.
CHECK_SECONDS: Final = 60
CHECK_RUN_SHARE: Final = 0.1
CHECK_SHARE_FROM_IMAGES: Final = 100_000
CHECK_WARMUP_BATCHES: Final = 2
CHECK_WINDOW_BATCHES: Final = 8
CHECK_WINDOW_SECONDS: Final = 2.0  # ... and before its rate being steady stops it early, its window spans this long
# ... and a reader's rate is its throughput only once its measured batches span at least its least window (or it read
# its whole sample): the shortest window at which its rate came within 20 % of a full read's in every size and round
# of the window-spread benchmark, worst of its runs of 2026-12-06 and 2026-12-07 (docs/readback.md "The window":
# `cassandra` raw 8 % at 1 s, 16-43 % at 0.5 s; `cassandra-simple` raw 16 % at 4 s, 93 % at 2 s (one full read
# stalled); `cassandra` train 16 % at 0.5 s, 20 % at 0.25 s; `cassandra-simple` train 13 % at 2 s, 20 % at 1 s;
# `shards-s3-stream` raw 2 % at 0.5 s, 23 % at 0.25 s; `shards-s3-webdataset` raw 17 % at 1 s, 21 % at 0.5 s; the
# train readers of shards within 10 % at 0.25 s). It reads that long whatever its share (never past the check's
# deadline), and a check that cannot give it that long does not start it. A reader the benchmark did not measure
# needs CHECK_LEAST_WINDOW_DEFAULT_S.
CHECK_LEAST_WINDOW_S: Final[dict[tuple[str, str], float]] = {
    ("cassandra", "raw"): 1.0,
    ("cassandra", "train"): 0.5,
    ("cassandra-simple", "raw"): 4.0,
    ("cassandra-simple", "train"): 2.0,
    ("shards-s3-stream", "raw"): 0.5,
    ("shards-s3-stream", "train"): 0.25,
    ("shards-s3-webdataset", "raw"): 1.0,
    ("shards-s3-webdataset", "train"): 0.25,
}
CHECK_LEAST_WINDOW_DEFAULT_S: Final = 0.5
# DALI's own s3:// reader reads one sample component per blocking request, so its rate does not depend on its batch
# size: it reads batches of at most this many, so that its warm-up and window take seconds, not tens of seconds.
CHECK_DALI_S3_BATCH: Final = 16
# ... and the check runs this many of its pipelines in parallel, each over its part of the shards (each keeps one
# request in flight): `imgest bench read --check-fidelity`'s dali_s3 part measures 1 to 8.
CHECK_DALI_S3_READERS: Final = 4
# ... over blocks of this many consecutive samples of each shard, in a seeded random order (imgest.readback.blocks):
# a read cut by the budget is then spread over the whole sample. 64 samples are ~0.5 MiB of a 4 MiB SeaweedFS
# chunk; opening a block costs DALI no more than its ranged reads (55 k, 4 pipelines: 228 img/s over blocks,
# 208 in shard order).
CHECK_DALI_S3_BLOCK: Final = 64
# ... whose turn (a process of its own: imgest.readback.dali_s3_process) takes 2-4 s to its first batch (its process's
# start, about 1.3 s, and its pipelines' build: the 55 k DAG run's check 2.3-3.0 s quiet) and 0.01-0.05 s to end (the
# check kills its process once its result came: it does not wait for its pipelines' deletion, 1.3-13 s): the check
# does not start it with less than these left before its deadline (it would overrun its budget); once one of its turns
# measured them, that turn's figures are what the next turn needs (a busy machine: 5-11 s to a first batch)
CHECK_DALI_S3_STARTUP_S: Final = 3.0
CHECK_DALI_S3_TEARDOWN_S: Final = 0.5
# ... and, as it reads last, it keeps this much of the check for itself when the check starts (the readers before it
# share what is left beyond it): its start-up, its warm-up and window (10 batches of 16 images from each of its
# pipelines) at 64 images/s (the 55 k DAG run's check: 75-85 images/s quiet, 48-64 beside three CPU hogs), and its
# teardown
CHECK_DALI_S3_RESERVE_S: Final = (
    CHECK_DALI_S3_STARTUP_S + 10 * CHECK_DALI_S3_BATCH * CHECK_DALI_S3_READERS / 64 + CHECK_DALI_S3_TEARDOWN_S
)

XNVME_LOOP_FS: Final = "ext4"  # the DAG's xNVMe check copies the files target onto a loop-mounted filesystem


# xNVMe validation (imgest validate xnvme, the DAG's validate_xnvme task)
XNVME_ENGINES: Final = ("dali_file", "python_file", "xnvme_file", "xnvme_block")
XNVME_BATCH_SIZE: Final = 64
XNVME_QUEUE_DEPTH: Final = 32  # block engine: reads in flight across a batch
XNVME_FILE_QUEUE_DEPTH: Final = 4  # file engine: pieces of one file in flight
XNVME_FILE_CHUNK: Final = 32 * 1024  # file engine: bytes per piece
XNVME_ROUNDS: Final = 3  # timed passes per engine after the verifying one; the median is reported
XNVME_THREADS: Final = 2  # DALI CPU threads
XNVME_SWEEP: Final = (1, 2, 4, 8, 16, 32, 64)
XNVME_LOOP_MB: Final = 0  # size of the loop filesystem image; 0: from the dataset's size

# After a publish the DAGs' gc task keeps the current version of a shards or files dataset and this many earlier.
KEEP_VERSIONS: Final = 1
