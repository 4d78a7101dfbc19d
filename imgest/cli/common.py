"""Options and helpers shared by several commands: sources, Spark master, credentials."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from imgest.core import workdir
from imgest.core.defaults import LOCAL_MASTER


def add_transform_args(p: argparse.ArgumentParser) -> None:
    from imgest.spark.job_options import TRANSFORM_OPTIONS, add_options

    add_options(p, TRANSFORM_OPTIONS)


def add_source_args(p: argparse.ArgumentParser) -> None:
    """SRC and how to scan it, and the Spark master: shared by the ingest commands."""
    p.add_argument("src", type=Path, metavar="SRC", help="dataset folder or tar, or a folder holding manifest.parquet")
    p.add_argument("--layout", default="auto", help="dataset layout when SRC must be scanned (default: detected)")
    p.add_argument("--work-dir", type=Path, help="where the scan goes (default .imgest/work/<dataset>)")
    p.add_argument("--master", default=LOCAL_MASTER, help=f"Spark master (default {LOCAL_MASTER})")
    add_link_policy_arg(p)


def add_link_policy_arg(p: argparse.ArgumentParser) -> None:
    """--follow-external-links: the scan's policy for symbolic links whose target leaves the source tree."""
    p.add_argument(
        "--follow-external-links",
        action="store_true",
        help="follow symbolic links whose target is outside SRC (default: skip them and count them in the report)",
    )


def manifest_dir(args: argparse.Namespace) -> Path:
    """SRC itself if it holds a manifest, else scan SRC into the work folder first."""
    if (args.src / workdir.MANIFEST).is_file():
        return args.src
    return scan_into(args, scan_dir(args))


def scan_dir(args: argparse.Namespace) -> Path:
    """Where the scan of SRC goes: --work-dir, else the state folder's work/<dataset>."""
    from imgest.core.paths import state_dir

    return args.work_dir or state_dir() / "work" / (args.dataset or args.src.resolve().name)


def scan_into(args: argparse.Namespace, out: Path) -> Path:
    """Scan SRC into OUT (its manifest, classes, quarantine and report) and print the scan's line; returns OUT."""
    from imgest.sources.scan import scan_to_dir

    report = scan_to_dir(args.src, out, args.layout, args.dataset, follow_external_links=args.follow_external_links)
    print(f"scan: {report.summary_line()}", flush=True)
    return out


def credentials_env(args: argparse.Namespace) -> None:
    """Put --user / --password-file into the environment the Spark job inherits (never into its argv)."""
    if args.user:
        os.environ["IMGEST_CASSANDRA_USER"] = args.user
    if args.password_file:
        os.environ["IMGEST_CASSANDRA_PASSWORD"] = Path(args.password_file).read_text().strip()


@contextmanager
def cli_run_state(master: str, dest: str | None, cassandra_lock: str | None = None) -> Iterator[str | None]:
    """While the block runs: where an ingest command on Spark master MASTER (writing to DEST, and to the keyspace
    of CASSANDRA_LOCK, its lock store there) keeps its lock and the files its executors read.
    ``$IMGEST_STATE_URL``; on a cluster without it, beside an ``s3://`` DEST (exported for the lock and the Spark
    job, restored afterwards), else a ConfigError naming the variable; None on a local master (this machine's state
    folder)."""
    from imgest.core.lock_stores import LOCK_URL_ENV, STATE_URL_ENV, lock_url_for, state_setting
    from imgest.core.run_state import Deployment, state_url_for

    configured = state_setting()
    s3_dest = dest if dest and dest.startswith("s3://") else None
    url = state_url_for(Deployment("", master), s3_dest, configured)
    exported = {LOCK_URL_ENV: lock_url_for(s3_dest, cassandra_lock)}  # where the DAG's runs take it too
    if url and not configured:
        print(f"run state: {url} (the master {master} runs executors on other hosts)", flush=True)
        exported[STATE_URL_ENV] = url
    before = {key: os.environ.get(key) for key in exported}
    os.environ.update({k: v for k, v in exported.items() if v})
    try:
        yield url
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def add_cassandra_args(p: argparse.ArgumentParser) -> None:
    """Where Cassandra is and who connects (the password is read from a file, never from argv)."""
    p.add_argument("--hosts", help="comma-separated contact points (default: $IMGEST_CASSANDRA_HOSTS; one is required)")
    p.add_argument("--port", type=int, help="CQL port (default: $IMGEST_CASSANDRA_PORT, else 9042)")
    p.add_argument("--user", help="Cassandra user")
    p.add_argument("--password-file", help="file holding the Cassandra password")
    from imgest.spark.job_options import CASSANDRA_OPTIONS

    connection = ("--consistency", "--local-dc", "--protocol-version", "--ssl-ca", "--ssl-cert", "--ssl-key")
    for flag, kwargs in CASSANDRA_OPTIONS:
        dest = flag.lstrip("-").replace("-", "_")
        if flag in connection and not any(a.dest == dest for a in p._actions):
            p.add_argument(flag, **kwargs)


def cassandra_settings(args: argparse.Namespace):  # -> CassandraSettings
    """Settings from --hosts/--port/--user/--password-file and, where the command has them, --consistency,
    --ssl-ca, --protocol-version and --local-dc; the rest from the environment."""
    from imgest.core.settings import CassandraSettings

    credentials_env(args)
    env = CassandraSettings.from_env(args.hosts, args.port)
    return CassandraSettings(
        hosts=env.hosts,
        port=env.port,
        username=env.username,
        password=env.password,
        ssl_ca_file=getattr(args, "ssl_ca", None) or env.ssl_ca_file,
        ssl_cert_file=getattr(args, "ssl_cert", None) or env.ssl_cert_file,
        ssl_key_file=getattr(args, "ssl_key", None) or env.ssl_key_file,
        ssl_ca_data=env.ssl_ca_data,
        ssl_cert_data=env.ssl_cert_data,
        ssl_key_data=env.ssl_key_data,
        protocol_version=getattr(args, "protocol_version", None) or env.protocol_version,
        consistency=getattr(args, "consistency", None) or env.consistency,
        local_dc=getattr(args, "local_dc", None) or env.local_dc,
    )


def run_command(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parse ARGV with PARSER and run its command: logging set up (-v: debug), imgest's errors as one line on
    stderr and exit status 1, an interrupt as 130."""
    args = parser.parse_args(argv)
    verbose = getattr(args, "verbose", False)
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("cassandra", "botocore", "urllib3", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not verbose:  # the driver's connection warnings carry tracebacks; imgest says what failed in one line
        logging.getLogger("cassandra").setLevel(logging.CRITICAL)
    from imgest.core.errors import ImgestError

    if getattr(args, "embedded", False):
        from imgest.services.embedded import use_embedded

        use_embedded()
    try:
        return int(args.func(args) or 0)
    except ImgestError as exc:
        print(f"imgest: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("imgest: interrupted", file=sys.stderr)
        return 130


def bench_done(args: argparse.Namespace, missed: list[str]) -> int:
    """A benchmark command's last lines: where its JSON (and plot) went, and the targets it missed."""
    print(f"JSON written to {args.json}" + (f"; plot {args.plot}" if args.plot else ""))
    if missed:
        print(f"below target: {', '.join(missed)}")
    return 0
