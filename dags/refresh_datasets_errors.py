"""Import errors of the datasets file: one line per malformed entry, naming the entry and the field.

An Airflow DAG file of its own, so that `airflow dags list-import-errors` and the UI show the problems while
`refresh_datasets.py` still loads the DAGs of every valid entry.
"""

from __future__ import annotations

from imgest.core.errors import ConfigError
from imgest.flow.registry import load_registry


class DatasetsFileError(ConfigError):
    """The datasets file has malformed entries."""


_PROBLEMS = load_registry().errors
if _PROBLEMS:
    raise DatasetsFileError("\n".join(_PROBLEMS))
