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


def test_no_deprecation_from_imgest_dags_or_operators(dagbag: dict) -> None:
    from tests.dags.dagbag_report import deprecations

    root = Path(__file__).parents[2]
    assert deprecations(dagbag, [str(root / d) for d in ("imgest", "dags", "operators")]) == []


def test_the_deprecation_check_catches_airflows_removal_warnings(airflow_home: AirflowServer, tmp_path: Path) -> None:
    """A DAG file whose task sets ``email`` gets Airflow's RemovedInAirflow4Warning while it is parsed, which the
    DagBag turns into a UserWarning naming the file (its category kept only in ``captured_warnings``): the check
    finds it there (a filter on the category's name containing "Deprecat" let it through)."""
    from tests.dags.dagbag_report import deprecations

    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "imgest_probe.py").write_text(
        "from airflow.providers.standard.operators.empty import EmptyOperator\n"
        "from airflow.sdk import DAG\n"
        "with DAG('probe', schedule=None, tags=['imgest']):\n"
        "    EmptyOperator(task_id='t', email='ops@example.com')\n"
    )
    out = tmp_path / "report.json"
    script = Path(__file__).with_name("dagbag_report.py")
    subprocess.run([sys.executable, str(script), str(dags), str(out)], env=airflow_home.env(), check=True)
    bag = json.loads(out.read_text())
    assert bag["import_errors"] == {}
    found = deprecations(bag, [str(dags)])
    assert found, bag["warnings"]
    assert {w["category"] for w in found} == {"RemovedInAirflow4Warning"}, found
    assert "Setting email on a task is deprecated" in found[0]["message"]
    assert "Deprecat" not in found[0]["category"]
    reemitted = [w for w in bag["warnings"] if "email" in w["message"] and w["category"] != found[0]["category"]]
    assert {w["category"] for w in reemitted} <= {"UserWarning"}  # all that Python's warnings saw of it


PARSE_PROBE = """
import json, sys
from tests.dags.dagbag_report import report
before = set(sys.modules)
bag = report(sys.argv[1])
heavy = sorted(m for m in ("numpy", "pyarrow", "PIL", "pyspark", "torch") if m in sys.modules and m not in before)
print(json.dumps({"dags": sorted(bag["dags"]), "errors": bag["import_errors"], "heavy": heavy}))
"""


def test_parsing_the_dags_imports_no_data_libraries_and_writes_nothing(
    airflow_home: AirflowServer, tmp_path: Path
) -> None:
    """A DAG processor parses every file often: with a home and an imgest home that do not exist (a worker image's
    read-only home), every DAG loads, none of numpy, pyarrow, PIL, pyspark or torch is imported, and neither folder
    is made."""
    home, state = tmp_path / "home", tmp_path / "imgest-home"
    env = {**airflow_home.env(), "HOME": str(home), "IMGEST_HOME": str(state)}
    env["IMGEST_DATASETS_FILE"] = str(EXAMPLE_DATASETS)
    env["PYTHONPATH"] = str(Path(__file__).parents[2])
    run = subprocess.run(
        [sys.executable, "-c", PARSE_PROBE, str(dags_dir())], env=env, capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["errors"] == {}
    assert {"ingest_imagenet", "check_datasets"} <= set(got["dags"])
    assert got["heavy"] == []
    assert not home.exists()
    assert not state.exists()
