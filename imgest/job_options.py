"""Options of the Spark ingest jobs, defined once: the job parses them, the CLI and DAG forward them."""

from __future__ import annotations

import argparse
from typing import Any

# (flag, argparse keyword arguments)
TRANSFORM_OPTIONS: list[tuple[str, dict[str, Any]]] = [
    (
        "--mode",
        {
            "default": "jpeg",
            "choices": ["jpeg", "unchanged"],
            "help": "jpeg: resize + center-crop + re-encode; unchanged: original bytes (default jpeg)",
        },
    ),
    ("--resize", {"type": int, "default": 256, "help": "shorter side after resize (default 256)"}),
    ("--crop", {"type": int, "default": 224, "help": "center-crop size (default 224)"}),
    ("--quality", {"type": int, "default": 90, "help": "JPEG quality (default 90)"}),
    (
        "--max-pixels",
        {
            "type": int,
            "default": 100_000_000,
            "help": "decompression-bomb limit; larger images are quarantined as too-large",
        },
    ),
]
CASSANDRA_OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("--dataset", {"help": "dataset name (default: from the manifest)"}),
    ("--version", {"help": "dataset version (default: t-<digest of the transform settings>)"}),
    ("--keyspace", {"default": "imgest", "help": "keyspace (default imgest)"}),
    (
        "--replication",
        {
            "default": "SimpleStrategy:1",
            "help": "SimpleStrategy:N or NetworkTopologyStrategy:dc1=N[,dc2=M] (default SimpleStrategy:1)",
        },
    ),
    (
        "--table-layout",
        {
            "default": "split-column",
            "choices": ["split-column", "per-split"],
            "help": "one data/metadata pair with a split column, or data_<split>/metadata_<split>",
        },
    ),
    ("--table-suffix", {"default": "", "help": "appended to table names, e.g. _orig for UNCHANGED images"}),
    ("--hosts", {"default": "127.0.0.1", "help": "comma-separated contact points (default 127.0.0.1)"}),
    ("--port", {"type": int, "default": 9042, "help": "CQL port (default 9042)"}),
    ("--partitions", {"type": int, "default": 0, "help": "Spark partitions (default: max(2 x cores, rows / 1000))"}),
    ("--max-in-flight", {"type": int, "default": 64, "help": "images on the wire per Spark task (default 64)"}),
    (
        "--max-blob-bytes",
        {
            "type": int,
            "default": 31 * 1024 * 1024,
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
        if value not in (None, ""):
            argv += [flag, str(value)]
    return argv


SHARD_OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("--dataset", {"help": "dataset name (default: from the manifest)"}),
    ("--max-count", {"type": int, "default": 5000, "help": "samples per shard at most (default 5000)"}),
    ("--max-bytes", {"type": int, "default": 1 << 30, "help": "bytes per shard at most (default 1 GiB)"}),
    ("--seed", {"type": int, "default": 0, "help": "shuffle seed: same input and seed, byte-identical shards"}),
    (
        "--partitions",
        {"type": int, "default": 0, "help": "Spark partitions (default: one per shard, at most 4 x cores)"},
    ),
]
