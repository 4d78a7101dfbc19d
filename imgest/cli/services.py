"""`imgest services`: start, stop and inspect the embedded services."""

from __future__ import annotations

import argparse


def services_cmd(args: argparse.Namespace) -> int:
    from imgest.services import ALL_SERVICE_NAMES, SERVICE_NAMES, get_service

    names = args.names or list(SERVICE_NAMES if args.action == "up" else ALL_SERVICE_NAMES)
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


def env_cmd(args: argparse.Namespace) -> int:
    from imgest.services import AirflowServer

    server = AirflowServer.default()
    env = server.env()
    for key in ("AIRFLOW_HOME", "IMGEST_HOME", "PATH"):
        print(f"export {key}={env[key]!s}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the top-level subparsers SUB."""
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
            help="cassandra, cassandra-auth (PasswordAuthenticator), cassandra-tls (TLS only, own CA), "
            "cassandra-ring (3 nodes on 127.0.0.2-4), s3, "
            "airflow, latency-proxy (Toxiproxy), spark (standalone master + 2 workers)",
        )
        p.set_defaults(func=services_cmd)
    env = services_sub.add_parser(
        "env",
        help="print shell exports for using the `airflow` CLI with imgest",
        description='Use as: eval "$(imgest services env)"',
    )
    env.set_defaults(func=env_cmd)
