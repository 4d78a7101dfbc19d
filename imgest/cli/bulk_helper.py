"""`imgest bulk-helper`: install the Cassandra bulk-load helper where imgest is installed, before any task runs."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def install_cmd(args: argparse.Namespace) -> int:
    from imgest.sinks.cassandra.bulk_install import install_helper

    home = install_helper(repository=args.repository, jars=args.jars, build=args.build, progress=print)
    print(home)
    return 0


def status_cmd(args: argparse.Namespace) -> int:
    from imgest.sinks.cassandra.bulk_helper import helper_homes, installed

    home = installed()
    if home is None:
        looked = ", ".join(str(h) for h in helper_homes())
        print(f"not installed (looked in {looked}): run `imgest bulk-helper install`")
        return 1
    jars = len(list((home / "lib").glob("*.jar")))
    print(f"installed in {home}: helper.jar and {jars} jars in lib/")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the top-level subparsers SUB."""
    from imgest.sinks.cassandra.bulk_build import MAVEN_CENTRAL  # standard library only: `imgest --help` stays light

    group = sub.add_parser(
        "bulk-helper",
        help="install the Cassandra bulk-load helper (--write-path bulk / cql-helper) before any task runs",
        description="The bulk write path streams SSTables through a small JVM program. A task never builds or fetches "
        "it: install it once where imgest is installed (an image's build, or each host whose tasks start Spark "
        "jobs; Spark ships it to the executors, which need only Java 17).",
    )
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    install = actions.add_parser(
        "install",
        help="put the helper in place: its jar from the wheel, the jars it runs on fetched and checked",
        description="Assembles <venv>/share/imgest/bulk-helper/<key>/ (the state folder where the environment is "
        "read-only): helper.jar (compiled when the wheel was built), lib/ (the jars of the wheel's "
        "runtime-jars.lock, about 100 jars and 69 MB, fetched from a Maven repository and checked against their "
        "sha256; no Maven needed), and a class-data archive that makes each helper start faster. Nothing is done "
        "where it is installed already.",
    )
    install.add_argument(
        "--repository",
        default=os.environ.get("IMGEST_MAVEN_REPOSITORY", MAVEN_CENTRAL),
        metavar="URL",
        help="Maven repository to fetch the locked jars from: your mirror, or file:///path/to/.m2/repository "
        f"(default: $IMGEST_MAVEN_REPOSITORY, else {MAVEN_CENTRAL})",
    )
    install.add_argument(
        "--jars",
        type=Path,
        metavar="DIR",
        help="use your own Cassandra 5.0 jars instead (every *.jar in DIR, e.g. the lib/ folder of a Cassandra 5.0 "
        "install): nothing is fetched",
    )
    install.add_argument(
        "--build",
        action="store_true",
        help="compile helper.jar here (a source checkout, whose package has none): needs a JDK 17 and Maven",
    )
    install.set_defaults(func=install_cmd)
    status = actions.add_parser("status", help="say where the helper is installed, or that it is not")
    status.set_defaults(func=status_cmd)
