"""imgest as an Airflow provider: what `airflow providers list` and the Connections UI learn from its entry point
(``apache_airflow_provider``). Imports nothing of Airflow or imgest's runtime: Airflow reads it at start-up."""

from __future__ import annotations

from importlib import metadata
from typing import Any

from imgest.operators.config_options import provider_config

INTEGRATION = "imgest"
HOOKS = ["imgest.operators.hooks"]
OPERATORS = [
    "imgest.operators.cassandra",
    "imgest.operators.readback",
    "imgest.operators.refresh",
    "imgest.operators.s3",
    "imgest.operators.smoke",
    "imgest.operators.spark",
    "imgest.operators.splits",
    "imgest.operators.validate",
]
# The DAG files the package ships (deploy them with `imgest dags install DIR` or a DAG bundle: docs/deploy.md).
DAGS = [
    "imgest.dags.ingest_imagenet",
    "imgest.dags.refresh_datasets",
    "imgest.dags.refresh_datasets_errors",
    "imgest.dags.check_datasets",
    "imgest.dags.smoke_services",
]


def _version() -> str:
    try:
        return metadata.version("imgest")
    except metadata.PackageNotFoundError:  # imported from a checkout that was never installed
        return "0+unknown"


def get_provider_info() -> dict[str, Any]:
    """The provider record Airflow's ProvidersManager validates (provider_info.schema.json) and lists. imgest adds no
    connection type: its hooks read Airflow's own `cassandra` and `aws` connections (cassandra_default,
    aws_default, and each source's)."""
    return {
        "package-name": "imgest",
        "name": "imgest",
        "description": "Ingest ImageNet-scale image datasets with Spark into Cassandra tables, webdataset shards on "
        "S3 or a file tree; verify, split and read them back with DALI.",
        "versions": [_version()],
        "integrations": [{"integration-name": INTEGRATION, "tags": ["software"]}],
        "hooks": [{"integration-name": INTEGRATION, "python-modules": HOOKS}],
        "operators": [{"integration-name": INTEGRATION, "python-modules": OPERATORS}],
        "dags": DAGS,
        "config": provider_config(),  # [imgest] in airflow.cfg / AIRFLOW__IMGEST__*: `airflow config list`
    }
