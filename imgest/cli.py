"""The `imgest` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from imgest import __version__
from imgest.errors import ImgestError

log = logging.getLogger("imgest")


def _services_cmd(args: argparse.Namespace) -> int:
    from imgest.services import SERVICE_NAMES, get_service

    names = args.names or list(SERVICE_NAMES)
    if args.action == "up":
        for name in names:
            print(get_service(name).up().message, flush=True)
    elif args.action == "down":
        for name in reversed(names):
            stopped = get_service(name).down()
            print(f"{name}: {'stopped' if stopped else 'was not started by imgest'}")
    else:
        for name in names:
            print(get_service(name).status().line())
    return 0


def _env_cmd(args: argparse.Namespace) -> int:
    from imgest.services import AirflowServer

    server = AirflowServer.default()
    env = server.env()
    for key in ("AIRFLOW_HOME", "IMGEST_HOME", "PATH"):
        print(f"export {key}={env[key]!s}")
    return 0


def _demo_cmd(args: argparse.Namespace) -> int:
    from imgest.demo import run_demo

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

    services = sub.add_parser(
        "services",
        help="start, stop or inspect the embedded Cassandra, S3 and Airflow",
        description="Embedded services for one machine. State (jars, data, logs, PIDs, AIRFLOW_HOME) "
        "lives in $IMGEST_HOME, by default .imgest/ in the checkout. Ports: IMGEST_CASSANDRA_PORT (9042), "
        "IMGEST_CASSANDRA_STORAGE_PORT (7000), IMGEST_S3_PORT (8333), IMGEST_AIRFLOW_PORT (8080).",
    )
    services_sub = services.add_subparsers(dest="action", metavar="ACTION", required=True)
    helps = {
        "up": "start services (all when none named) and wait until each answers",
        "down": "stop the services that imgest started (by PID)",
        "status": "show each service, its address and whether it answers",
    }
    for action, text in helps.items():
        p = services_sub.add_parser(action, help=text, description=text)
        p.add_argument(
            "names",
            nargs="*",
            metavar="SERVICE",
            help="cassandra, cassandra-auth (PasswordAuthenticator), s3, airflow",
        )
        p.set_defaults(func=_services_cmd)
    env = services_sub.add_parser(
        "env",
        help="print shell exports for using the `airflow` CLI with imgest",
        description='Use as: eval "$(imgest services env)"',
    )
    env.set_defaults(func=_env_cmd)

    demo = sub.add_parser(
        "demo",
        help="start the embedded services and run the main job on a generated sample",
        description="What the README's first command runs.",
    )
    demo.set_defaults(func=_demo_cmd)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `imgest` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("cassandra", "botocore", "urllib3", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except ImgestError as exc:
        print(f"imgest: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("imgest: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
