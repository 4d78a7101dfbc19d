"""Every DAG file imports cleanly and carries tags, retries and catchup=False."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from imgest.core.paths import dags_dir
from imgest.services import AirflowServer

EXAMPLE_DATASETS = Path(__file__).parents[2] / "examples" / "datasets.toml"


@pytest.fixture(scope="module")
def dagbag(airflow_home: AirflowServer, tmp_path_factory: pytest.TempPathFactory) -> dict:
    script = Path(__file__).with_name("dagbag_report.py")
    out = tmp_path_factory.mktemp("dagbag") / "report.json"
    subprocess.run(
        [sys.executable, str(script), str(dags_dir()), str(out)],
        env={**airflow_home.env(), "IMGEST_DATASETS_FILE": str(EXAMPLE_DATASETS)},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.read_text())


def test_no_import_errors(dagbag: dict) -> None:
    assert dagbag["import_errors"] == {}


def test_every_dag_file_defines_a_dag(dagbag: dict) -> None:
    errors_only = {"refresh_datasets_errors.py"}  # raises only when the datasets file has malformed entries
    files = {Path(p).name for p in dags_dir().glob("*.py") if not p.name.startswith("_")} - errors_only
    loaded = {Path(d["fileloc"]).name for d in dagbag["dags"].values()}
    assert files == loaded


def test_tags_retries_and_no_catchup(dagbag: dict) -> None:
    assert dagbag["dags"], "no DAG loaded"
    for dag_id, dag in dagbag["dags"].items():
        assert "imgest" in dag["tags"], dag_id
        assert dag["catchup"] is False, dag_id
        for task_id, task in dag["tasks"].items():
            assert task["retries"] >= 2, f"{dag_id}.{task_id}"
