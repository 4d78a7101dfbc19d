"""Loads every DAG file through a DagBag and writes a JSON report (run in a subprocess by the tests)."""

from __future__ import annotations

import json
import sys
import warnings

try:
    from airflow.dag_processing.dagbag import DagBag
except ImportError:  # Airflow 3.1
    from airflow.models.dagbag import DagBag


def report(dag_folder: str) -> dict[str, object]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bag = DagBag(dag_folder=dag_folder)
    return {
        "warnings": [
            {"category": w.category.__name__, "message": str(w.message), "filename": w.filename} for w in caught
        ],
        "import_errors": {str(k): str(v) for k, v in bag.import_errors.items()},
        "dags": {
            dag_id: {
                "tags": sorted(dag.tags or []),
                "catchup": dag.catchup,
                "fileloc": dag.fileloc,
                "tasks": {t.task_id: {"retries": t.retries} for t in dag.tasks},
            }
            for dag_id, dag in bag.dags.items()
        },
    }


if __name__ == "__main__":
    # Airflow logs to stdout, so the report goes to a file: dagbag_report.py DAG_FOLDER OUT_JSON
    with open(sys.argv[2], "w") as out:
        json.dump(report(sys.argv[1]), out)
