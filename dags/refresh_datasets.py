"""refresh_<name>: one scheduled Airflow DAG per dataset of the datasets file (`$IMGEST_DATASETS_FILE`).

Parsing reads that one small TOML file and nothing else. Each DAG is built by imgest's factory
(imgest.operators.refresh_dag.build_refresh_dag) with the default connection ids: each run takes the dataset's write
lock, scans the source again and ingests only what changed since the last complete version (no change: no Spark job,
no version), verifies and announces the new version as an Asset, which triggers `check_datasets`. Malformed entries
are reported by `refresh_datasets_errors.py` (an import error naming entry and field); the valid entries' DAGs still
load from this file.
"""

from __future__ import annotations

from imgest.flow.registry import load_registry
from imgest.operators.config_options import export_section
from imgest.operators.refresh_dag import build_refresh_dag

export_section()  # [imgest] datasets_file of Airflow's configuration, unless $IMGEST_DATASETS_FILE is set
REGISTRY = load_registry()
for _entry in REGISTRY.entries:
    globals()[f"refresh_{_entry.name}"] = build_refresh_dag(_entry)
