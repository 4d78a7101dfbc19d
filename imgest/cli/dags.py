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


def install(folder: Path, force: bool = False) -> list[Path]:
    """Write one DAG file per shipped DAG module into FOLDER (imgest_<name>.py); an existing file that differs is
    kept unless FORCE. Returns the files written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for module in dag_modules():
        path = folder / f"imgest_{module.rpartition('.')[2]}.py"
        text = stub(module)
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
    try:
        written = install(args.folder, force=args.force)
    except FileExistsError as exc:
        print(f"imgest dags install: {exc}")
        return 1
    for path in written:
        print(f"wrote {path}")
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
    inst.set_defaults(func=install_cmd)
    bun = dags_sub.add_parser(
        "bundle",
        help="print a dag_bundle_config_list entry that serves the installed DAG folder (Airflow 3 DAG bundles)",
        description="Add the printed object to [dag_processor] dag_bundle_config_list "
        "(AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST), beside the deployment's own bundles.",
    )
    bun.add_argument("--name", default="imgest", help="the bundle's name (default: imgest)")
    bun.set_defaults(func=bundle_cmd)
