"""Loads every DAG file through a DagBag and writes a JSON report (run in a subprocess by the tests).

Each warning is recorded with its category's class names (Airflow's RemovedInAirflow4Warning is a
DeprecationWarning, its DeprecatedImportWarning a FutureWarning) and the files of the stack that raised it: Airflow
warns with a stacklevel that names its own wrapper, so whether imgest's code caused a warning is read from the stack.
A warning raised while a DAG file is parsed reaches Python's warnings again only as a UserWarning naming the file
(Airflow 3.3's DagBag re-emits it so); its own category is in the DagBag's ``captured_warnings``, recorded here
with the file that was being parsed.
"""

from __future__ import annotations

import json
import re
import sys
import traceback
import warnings
from collections.abc import Sequence
from typing import Any

try:
    from airflow.dag_processing.dagbag import DagBag
except ImportError:  # Airflow 3.1
    from airflow.models.dagbag import DagBag

DEPRECATIONS = {"DeprecationWarning", "PendingDeprecationWarning", "FutureWarning"}
CAPTURED = re.compile(r"^(?P<file>.*?):(?P<line>\d+|None): (?P<type>[\w.]+): (?P<message>.*)$", re.DOTALL)


def report(dag_folder: str) -> dict[str, object]:
    caught: list[dict[str, Any]] = []

    def record(message: Any, category: type[Warning], filename: str, lineno: int, *_: Any, **__: Any) -> None:
        stack = [frame.filename for frame in traceback.extract_stack()[:-1]]
        kinds = [c.__name__ for c in category.__mro__]
        caught.append({"category": category.__name__, "kinds": kinds, "message": str(message), "filename": filename})
        caught[-1]["stack"] = stack

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record  # Airflow's own hook logs them instead (it was set when it was imported)
        bag = DagBag(dag_folder=dag_folder)
    return {
        "warnings": caught + captured(getattr(bag, "captured_warnings", {})),
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


def captured(by_file: dict[str, tuple[str, ...]]) -> list[dict[str, Any]]:
    """The DagBag's CAPTURED warnings (``file:line: Type: message`` per DAG file parsed) as report entries; only the
    category's name is known, so a name of Airflow's deprecation kinds counts as a DeprecationWarning."""
    entries = []
    for parsed, lines in by_file.items():
        for line in lines:
            m = CAPTURED.match(line)
            kind = m["type"].rsplit(".", 1)[-1] if m else "Warning"  # airflow.sdk.exceptions.RemovedInAirflow4Warning
            deprecated = kind in DEPRECATIONS or "Deprecat" in kind or kind.startswith("RemovedIn")
            kinds = [kind, "DeprecationWarning"] if deprecated else [kind]
            entries.append(
                {"category": kind, "kinds": kinds, "message": m["message"] if m else line, "filename": parsed}
            )
            entries[-1]["stack"] = []
    return entries


def deprecations(bag: dict[str, Any], roots: Sequence[str]) -> list[dict[str, Any]]:
    """The warnings of BAG's report of a deprecation kind (removals and providers' deprecations included) that a file
    under one of ROOTS raised or led to (anywhere on the stack)."""
    ours = []
    for w in bag["warnings"]:
        files = [w["filename"], *w["stack"]]
        if DEPRECATIONS & set(w["kinds"]) and any(f.startswith(tuple(roots)) for f in files):
            ours.append({k: w[k] for k in ("category", "message", "filename")})
    return ours


if __name__ == "__main__":
    # Airflow logs to stdout, so the report goes to a file: dagbag_report.py DAG_FOLDER OUT_JSON
    with open(sys.argv[2], "w") as out:
        json.dump(report(sys.argv[1]), out)
