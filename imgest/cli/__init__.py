"""The `imgest` command line: one module per command group, assembled here."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from imgest import __version__
from imgest.cli import (
    adopt,
    bench,
    bulk_helper,
    dags,
    data,
    gc,
    ingest,
    refresh,
    services,
    spark,
    split,
    validate,
    verify,
)
from imgest.cli.common import run_command

log = logging.getLogger("imgest")


def _demo_cmd(args: argparse.Namespace) -> int:
    from imgest.services.demo import run_demo

    return run_demo()


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every imgest command."""
    parser = argparse.ArgumentParser(
        prog="imgest",
        description="Turn ImageNet-scale image datasets into training-ready storage "
        "(Cassandra tables or webdataset shards on S3), orchestrated by Airflow, computed by Spark.",
    )
    parser.add_argument("--version", action="version", version=f"imgest {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    groups = (services, data, bench, ingest, refresh, verify, split, adopt, validate, gc, dags, bulk_helper, spark)
    for group in groups:
        group.register(sub)
    demo = sub.add_parser(
        "demo",
        help="start the embedded services and run the main job on a generated sample",
        description="What the README's first command runs.",
    )
    demo.set_defaults(func=_demo_cmd)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `imgest` console script."""
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
