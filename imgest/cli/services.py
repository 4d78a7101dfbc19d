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
    import shlex

    from imgest.services import AirflowServer
    from imgest.services.embedded import embedded_env

    server = AirflowServer.default()
    env = server.env()
    for key in ("AIRFLOW_HOME", "IMGEST_HOME", "PATH", *embedded_env()):
        print(f"export {key}={shlex.quote(str(env[key]))}")
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
            "airflow, airflow-celery (CeleryExecutor, PostgreSQL, Redis, 2 workers), latency-proxy (Toxiproxy), "
            "spark (standalone master + 2 workers), spark-connect (a Spark Connect server, sc://127.0.0.1:15002, on "
            "that cluster), hosts (the whole deployment on 7 network-namespace hosts "
            "that share nothing; root)",
        )
        p.set_defaults(func=services_cmd)
    env = services_sub.add_parser(
        "env",
        help="print shell exports for the embedded services: the `airflow` CLI, and the addresses and keys "
        "imgest's commands use to reach Cassandra and S3",
        description='Use as: eval "$(imgest services env)". Without these, imgest reaches no store by itself: each '
        "command needs --hosts / IMGEST_CASSANDRA_HOSTS and IMGEST_S3_ENDPOINT (none: AWS S3) or a connection.",
    )
    env.set_defaults(func=env_cmd)
