"""`imgest dags`: deploy the installed package's DAGs into an existing Airflow (a DAG file each, or a bundle)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# What a deployment sets for the DAGs (docs/deploy.md has the whole list).
NEEDS = """Set in the deployment (connections as AIRFLOW_CONN_* variables, the UI or `airflow connections add`):
  cassandra_default   conn_type cassandra: host "h1,h2", port, login/password, extra {"ssl_options": ...}
  aws_default         conn_type aws: keys, or none for the host's role; extra {"endpoint_url": ...} off AWS
  spark_default       conn_type spark: host spark://master:7077 (or k8s://..., yarn)
  IMGEST_STATE_URL    s3://bucket/prefix for run state across hosts (default: beside the run's S3 destination)
Optional: IMGEST_DATASETS_FILE (the refresh DAGs' datasets file), IMGEST_SHARED_MOUNTS, IMGEST_SPARK_PYENV."""


def dag_modules() -> list[str]:
    """The DAG modules the package ships (imgest.dags.*), from its provider record."""
    from imgest.operators.provider_info import DAGS

    return list(DAGS)


def stub(module: str) -> str:
    """A one-line Airflow DAG file that loads MODULE's DAGs from the installed package."""
    name = module.rpartition(".")[2]
    return (
        f'"""{name}: Airflow DAG file loading imgest\'s DAGs from the installed package (`imgest dags install`)."""\n'
        "\n"
        f"from {module} import *  # noqa: F403\n"
    )


def factory_file(dag_id: str, connections: dict[str, str], spark_pool: str | None) -> str:
    """A DAG file that builds ingest_imagenet under DAG_ID with the connection ids CONNECTIONS (cassandra, aws,
    source, spark: those not given keep their defaults) and SPARK_POOL, through imgest's factory."""
    conns = ", ".join(f"{k}={json.dumps(v)}" for k, v in connections.items())
    pool = f", spark_pool={json.dumps(spark_pool)}" if spark_pool else ""
    return (
        f'"""{dag_id}: an Airflow DAG file building imgest\'s ingest DAG (`imgest dags install --dag-id`)."""\n'
        "\n"
        "from imgest.operators.dag_connections import DagConnections\n"
        "from imgest.operators.ingest_dag import ingest_imagenet_dag\n"
        "\n"
        f"dag = ingest_imagenet_dag({json.dumps(dag_id)}, connections=DagConnections({conns}){pool})\n"
    )


def install(
    folder: Path,
    force: bool = False,
    dag_id: str | None = None,
    connections: dict[str, str] | None = None,
    spark_pool: str | None = None,
) -> list[Path]:
    """Write one DAG file per shipped DAG module into FOLDER (imgest_<name>.py); an existing file that differs is
    kept unless FORCE. Returns the files written. With DAG_ID, instead one file, imgest_<DAG_ID>.py, building the
    ingest DAG under that id with CONNECTIONS and SPARK_POOL (factory_file)."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {f"imgest_{m.rpartition('.')[2]}.py": stub(m) for m in dag_modules()}
    if dag_id:
        files = {f"imgest_{dag_id}.py": factory_file(dag_id, connections or {}, spark_pool)}
    written = []
    for name, text in files.items():
        path = folder / name
        if path.exists() and path.read_text() != text and not force:
            raise FileExistsError(f"{path} exists and differs from imgest's DAG file: move it, or give --force")
        path.write_text(text)
        written.append(path)
    return written


def bundle_entry(name: str = "imgest") -> dict[str, object]:
    """An entry for Airflow's `[dag_processor] dag_bundle_config_list`: the installed DAG folder as a local bundle."""
    from imgest.core.paths import dags_dir

    return {
        "name": name,
        "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
        "kwargs": {"path": str(dags_dir())},
    }


def install_cmd(args: argparse.Namespace) -> int:
    from imgest.core.errors import ConfigError

    conns = {
        k: getattr(args, f"{k}_conn") for k in ("cassandra", "aws", "source", "spark") if getattr(args, f"{k}_conn")
    }
    if (conns or args.spark_pool) and not args.dag_id:
        raise ConfigError("connection ids and --spark-pool go with --dag-id (a DAG of its own)")
    try:
        written = install(
            args.folder, force=args.force, dag_id=args.dag_id, connections=conns, spark_pool=args.spark_pool
        )
    except FileExistsError as exc:
        print(f"imgest dags install: {exc}")
        return 1
    for path in written:
        print(f"wrote {path}")
    if args.dag_id:
        print(f"{args.dag_id} reads the connections {', '.join(f'{k}: {v}' for k, v in conns.items()) or 'by default'}")
    print(NEEDS)
    return 0


def bundle_cmd(args: argparse.Namespace) -> int:
    print(json.dumps(bundle_entry(args.name)))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the top-level subparsers SUB."""
    dags = sub.add_parser("dags", help="deploy imgest's DAGs into an existing Airflow (DAG files or a bundle)")
    dags_sub = dags.add_subparsers(dest="dags_command", metavar="COMMAND", required=True)
    inst = dags_sub.add_parser(
        "install",
        help="write a one-line DAG file per imgest DAG into FOLDER (your dags folder)",
        description="Each file imports one DAG module of the installed package (ingest_imagenet, refresh_datasets "
        "and its errors file, check_datasets, smoke_services), so upgrading the package upgrades the DAGs. Prints "
        "the connections and variables the DAGs read.",
    )
    inst.add_argument(
        "folder", type=Path, metavar="FOLDER", help="the deployment's DAG folder (e.g. $AIRFLOW_HOME/dags)"
    )
    inst.add_argument("--force", action="store_true", help="overwrite files of the same name that differ")
    inst.add_argument(
        "--dag-id",
        metavar="ID",
        help="instead: one file building the ingest DAG under this id through imgest's factory, with the connection "
        "ids below (a DAG beside ingest_imagenet, e.g. for another team's stores)",
    )
    for kind, default in (("cassandra", "cassandra_default"), ("aws", "aws_default"), ("spark", "spark_default")):
        inst.add_argument(f"--{kind}-conn", metavar="CONN_ID", help=f"with --dag-id: its {kind} connection ({default})")
    inst.add_argument(
        "--source-conn",
        metavar="CONN_ID",
        help="with --dag-id: the default connection of an s3:// source (aws_default)",
    )
    inst.add_argument("--spark-pool", metavar="POOL", help="with --dag-id: the pool of its Spark jobs")
    inst.set_defaults(func=install_cmd)
    bun = dags_sub.add_parser(
        "bundle",
        help="print a dag_bundle_config_list entry that serves the installed DAG folder (Airflow 3 DAG bundles)",
        description="Add the printed object to [dag_processor] dag_bundle_config_list "
        "(AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST), beside the deployment's own bundles.",
    )
    bun.add_argument("--name", default="imgest", help="the bundle's name (default: imgest)")
    bun.set_defaults(func=bundle_cmd)
