"""Options of the Spark ingest jobs, defined once: the job parses them, the CLI and DAG forward them."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from imgest.core import defaults
from imgest.spark.partitions import REMOTE_ENV, REMOTE_OPTION
from imgest.transform.revisions import DECODER_ALIASES, DECODER_CHOICES, decoder_help

# (flag, argparse keyword arguments)
TRANSFORM_OPTIONS: list[tuple[str, dict[str, Any]]] = [
    (
        "--mode",
        {
            "default": defaults.IMAGE_MODE,
            "choices": list(defaults.IMAGE_MODES),
            "help": "jpeg: resize + center-crop + re-encode; unchanged: original bytes (default jpeg)",
        },
    ),
    (
        "--resize",
        {"type": int, "default": defaults.RESIZE, "help": f"shorter side after resize (default {defaults.RESIZE})"},
    ),
    ("--crop", {"type": int, "default": defaults.CROP, "help": f"center-crop size (default {defaults.CROP})"}),
    ("--quality", {"type": int, "default": defaults.QUALITY, "help": f"JPEG quality (default {defaults.QUALITY})"}),
    (
        "--unchanged-check",
        {
            "default": defaults.UNCHANGED_CHECK,
            "choices": list(defaults.UNCHANGED_CHECKS),
            "help": "unchanged mode: decode (every file decoded at 1/8 scale, the default) or header (header "
            "parsed and JPEG/PNG end marker present, no pixels decoded: faster, a corrupt middle passes)",
        },
    ),
    (
        "--jpeg-decoder",
        {
            "choices": [*DECODER_CHOICES, *DECODER_ALIASES],
            "metavar": "{" + ",".join(DECODER_CHOICES) + "}",
            "help": "JPEG decode and resample: " + decoder_help() + " Recorded with the transform as its revision",
        },
    ),
    (
        "--max-pixels",
        {
            "type": int,
            "default": defaults.MAX_PIXELS,
            "help": "decompression-bomb limit; larger images are quarantined as too-large",
        },
    ),
]
CASSANDRA_OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("--dataset", {"help": "dataset name (default: from the manifest)"}),
    ("--version", {"help": "dataset version (default: t-<digest of the transform settings>)"}),
    ("--keyspace", {"default": defaults.KEYSPACE, "help": f"keyspace (default {defaults.KEYSPACE})"}),
    (
        "--replication",
        {
            "default": defaults.REPLICATION,
            "help": f"SimpleStrategy:N or NetworkTopologyStrategy:dc1=N[,dc2=M] (default {defaults.REPLICATION})",
        },
    ),
    (
        "--table-layout",
        {
            "default": defaults.TABLE_LAYOUT,
            "choices": list(defaults.TABLE_LAYOUTS),
            "help": "one data/metadata pair with a split column, or data_<split>/metadata_<split>",
        },
    ),
    (
        "--table-suffix",
        {"default": defaults.TABLE_SUFFIX, "help": "appended to table names, e.g. _orig for UNCHANGED images"},
    ),
    ("--hosts", {"help": "comma-separated contact points (default: $IMGEST_CASSANDRA_HOSTS; one is required)"}),
    ("--port", {"type": int, "help": "CQL port (default: $IMGEST_CASSANDRA_PORT, else 9042)"}),
    (
        "--consistency",
        {
            "type": str.upper,
            "choices": list(defaults.CONSISTENCY_LEVELS),
            "help": "consistency level of writes and verify reads "
            f"(default: IMGEST_CASSANDRA_CONSISTENCY, else {defaults.CONSISTENCY})",
        },
    ),
    (
        "--local-dc",
        {
            "help": "data centre tried first and counted by LOCAL_* levels (default: IMGEST_CASSANDRA_LOCAL_DC, else "
            "the contact point's)"
        },
    ),
    (
        "--protocol-version",
        {
            "type": int,
            "choices": [3, 4, 5],
            "help": "native protocol version (default: IMGEST_CASSANDRA_PROTOCOL, else 4)",
        },
    ),
    (
        "--ssl-ca",
        {
            "help": "CA certificate (PEM) that turns TLS on; read where the job is submitted and shipped to "
            "executors (default: IMGEST_CASSANDRA_SSL_CA)"
        },
    ),
    (
        "--ssl-cert",
        {
            "help": "client certificate (PEM) for a cluster that requires one (mutual TLS), with --ssl-key; read "
            "where the job is submitted and shipped to executors (default: IMGEST_CASSANDRA_SSL_CERT)"
        },
    ),
    ("--ssl-key", {"help": "the client certificate's key (PEM, unencrypted; default: IMGEST_CASSANDRA_SSL_KEY)"}),
    (
        "--replace-version",
        {
            "action": "store_true",
            "help": "replace another version of the dataset that lives in the same tables (default: refuse)",
        },
    ),
    (
        "--partitions",
        {
            "type": int,
            "default": defaults.SPARK_PARTITIONS,
            "help": "Spark partitions (default: max(2 x cores, rows / 1000))",
        },
    ),
    (
        "--write-path",
        {
            "default": defaults.WRITE_PATH,
            "choices": list(defaults.WRITE_PATHS),
            "help": "cql: an UNLOGGED batch per image through the Python driver; cql-helper: the same batch per image "
            "sent by the helper's Java driver (less client CPU per row; Java on the executors); bulk: executors write "
            "SSTables and stream them to every replica (Cassandra 5, Java on the executors; the helper is built once "
            "with Maven); auto "
            f"(default): from {defaults.BULK_MIN_ROWS} rows bulk where the cluster can take it (Cassandra 5), else "
            "cql-helper where Java is found; cql below that",
        },
    ),
    (
        "--storage-port",
        {
            "type": int,
            "help": "bulk path: the nodes' internode (storage) port the loader streams to (default: the contact "
            "node's listen_port)",
        },
    ),
    (
        "--max-in-flight",
        {"type": int, "default": defaults.MAX_IN_FLIGHT, "help": "images on the wire per Spark task (default 64)"},
    ),
    (
        "--max-blob-bytes",
        {
            "type": int,
            "default": defaults.MAX_BLOB_BYTES,
            "help": "larger images are quarantined as too-large-for-store (default 31 MiB)",
        },
    ),
]


def add_options(parser: argparse.ArgumentParser, options: list[tuple[str, dict[str, Any]]]) -> None:
    for flag, kwargs in options:
        parser.add_argument(flag, **kwargs)


def forward(ns: argparse.Namespace, options: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The job argv for the values in NS of OPTIONS (only those set, defaults stay the job's)."""
    argv: list[str] = []
    for flag, _ in options:
        value = getattr(ns, flag.lstrip("-").replace("-", "_"), None)
        if value is True:
            argv.append(flag)
        elif value not in (None, "", False):
            argv += [flag, str(value)]
    return argv


SHARD_OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("--dataset", {"help": "dataset name (default: from the manifest)"}),
    (
        "--max-count",
        {"type": int, "default": defaults.SHARD_MAX_COUNT, "help": "samples per shard at most (default 5000)"},
    ),
    (
        "--max-bytes",
        {"type": int, "default": defaults.SHARD_MAX_BYTES, "help": "bytes per shard at most (default 1 GiB)"},
    ),
    (
        "--seed",
        {
            "type": int,
            "default": defaults.SHUFFLE_SEED,
            "help": "shuffle seed: same input and seed, byte-identical shards",
        },
    ),
    (
        "--partitions",
        {
            "type": int,
            "default": defaults.SPARK_PARTITIONS,
            "help": "Spark partitions (default: one per shard, at most 4 x cores)",
        },
    ),
    (
        "--read-order",
        {
            "default": "auto",
            "choices": ["auto", "plan", "source"],
            "help": "plan: each shard reads its samples where they lie; source: read the source forward and let Spark "
            "move each sample to its shard (one pass over an archive instead of a GET per image); auto (default): "
            "source for tar archives on S3",
        },
    ),
]


class _RemoteAction(argparse.Action):
    """--spark-remote: sets $SPARK_REMOTE, which the job's session builder (imgest.spark.submit) follows."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, _: Any = None):
        setattr(namespace, self.dest, values)
        os.environ[REMOTE_ENV] = str(values)


def job_parser(prog: str, doc: str | None, *groups: list[tuple[str, dict[str, Any]]]) -> argparse.ArgumentParser:
    """The argument parser of a Spark job: --manifest-dir, --summary-json and the option GROUPS."""
    p = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--manifest-dir", type=Path, required=True, help="output folder of imgest scan")
    add_common_options(p)
    for group in groups:
        add_options(p, group)
    return p


def add_common_options(p: argparse.ArgumentParser) -> None:
    """What every job takes: --summary-json and --spark-remote."""
    p.add_argument("--summary-json", type=Path, help="also write the JSON summary here")
    p.add_argument(
        REMOTE_OPTION,
        metavar="sc://HOST:PORT",
        action=_RemoteAction,
        help="run through Spark Connect at this endpoint: this process is the session's thin client (no JVM); a "
        "token comes from $SPARK_CONNECT_AUTHENTICATE_TOKEN",
    )


FILES_OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("--dataset", {"help": "dataset name (default: from the manifest)"}),
    (
        "--partitions",
        {"type": int, "default": defaults.SPARK_PARTITIONS, "help": "Spark partitions (default: by size)"},
    ),
]
