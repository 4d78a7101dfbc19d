"""`imgest spark`: put Spark beside the environment (never over its pyspark-client), or say which Spark runs jobs."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def install_cmd(args: argparse.Namespace) -> int:
    from imgest.spark.distribution import install

    install(args.version, find_links=args.find_links, index_url=args.index_url, progress=print)
    return 0


def status_cmd(args: argparse.Namespace) -> int:
    from imgest.spark.distribution import homes, installed, spark_home

    home = spark_home()
    if home is None:
        looked = ", ".join(str(h) for h in homes())
        print(f"no Spark: SPARK_HOME is not a Spark folder and none is installed (looked in {looked})")
        print("run `imgest spark install`, or set SPARK_HOME; an sc:// master (Spark Connect) needs neither")
        return 1
    own = installed()
    if os.environ.get("SPARK_HOME") and home == Path(os.environ["SPARK_HOME"]).resolve():
        source = "SPARK_HOME"
    elif own is not None and home.parent == own.resolve():
        source = f"imgest spark install ({own.name.replace('-', ' ', 1)})"
    else:
        source = "the pyspark package of this environment"
    print(f"Spark in {home} ({source}); spark-submit: {home / 'bin' / 'spark-submit'}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the top-level subparsers SUB."""
    group = sub.add_parser(
        "spark",
        help="install Spark beside this environment (spark-submit, local masters, the embedded cluster)",
        description="Jobs through spark-submit, a local master and the embedded Spark services need Spark itself. "
        "imgest finds it in $SPARK_HOME (your platform's), else where `imgest spark install` put it, else in a "
        "pyspark installed into this environment. The pyspark package is never installed among this environment's "
        "packages: Airflow's Spark provider brings pyspark-client, whose files pyspark's would overwrite. "
        "Spark Connect (an sc:// master) needs none of it in the Airflow worker.",
    )
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    from imgest.spark.distribution import PYSPARK_VERSION

    install = actions.add_parser(
        "install",
        help="pyspark and py4j into <venv>/share/imgest/spark/pyspark-VERSION/ (about 500 MB)",
        description="Installs pyspark (Spark's jars, scripts and PySpark) and py4j from the package index, or from "
        "--find-links wheels, into a folder of their own beside the environment (the state folder where the "
        "environment is read-only), compiles them to bytecode and compares them with Spark's source zip (so Spark's "
        "Python workers import the bytecode). Nothing is done where it is installed already.",
    )
    install.add_argument("--version", default=PYSPARK_VERSION, help=f"pyspark version (default {PYSPARK_VERSION})")
    install.add_argument(
        "--find-links",
        action="append",
        default=[],
        metavar="DIR_OR_URL",
        help="wheels to install from (pyspark is published as an sdist only; a wheelhouse saves its build)",
    )
    install.add_argument("--index-url", help="the package index (default: pip's or uv's configured one)")
    install.set_defaults(func=install_cmd)
    status = actions.add_parser("status", help="say which Spark runs jobs, or that there is none")
    status.set_defaults(func=status_cmd)
