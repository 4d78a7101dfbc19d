"""The built wheel, installed into a fresh virtual environment, runs the CLI, ships the CQL and the DAGs."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from imgest.core.paths import repo_root, state_dir

pytestmark = pytest.mark.slow
ROOT = repo_root()


def _run(*cmd: str | Path, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True, **kw)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if ROOT is None:
        pytest.skip("needs a source checkout")
    out = tmp_path_factory.mktemp("dist")
    uv = Path(sys.executable).parent / "uv"
    _run(uv, "build", "--wheel", "--out-dir", out, ROOT, cwd=ROOT)
    return next(out.glob("imgest-*.whl"))


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = tmp_path_factory.mktemp("venv") / "v"
    uv = Path(sys.executable).parent / "uv"
    _run(uv, "venv", "-q", "--python", sys.executable, env)
    # the wheels scripts/install.sh built of the lock's sdist-only packages (pyspark), when it built them
    wheelhouse = state_dir() / "wheelhouse"
    links = ["--find-links", wheelhouse] if wheelhouse.is_dir() else []
    lock = ROOT / "requirements" / "runtime.lock"
    _run(uv, "pip", "install", "-q", "--python", env / "bin" / "python", *links, "-r", lock)
    _run(uv, "pip", "install", "-q", "--python", env / "bin" / "python", "--no-deps", wheel)
    return env


def test_wheel_installs_no_generic_top_level_names(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        tops = {name.split("/", 1)[0] for name in zf.namelist()}
        names = set(zf.namelist())
    assert {t for t in tops if not t.endswith(".dist-info")} == {"imgest"}
    assert "imgest/sql/data_table.cql" in names
    assert "imgest/dags/ingest_imagenet.py" in names
    assert "imgest/jobs/pack_shards.py" in names
    assert "imgest/operators/hooks.py" in names


def test_wheel_runs_cli_and_loads_schema_and_dags(venv: Path, tmp_path: Path) -> None:
    py = venv / "bin" / "python"
    assert "ingest" in _run(venv / "bin" / "imgest", "--help", cwd=tmp_path).stdout
    probe = (
        "import json; from imgest.core.paths import dags_dir, jobs_dir, repo_root; "
        "from imgest.sinks.cassandra.schema import TableLayout, schema_statements; "
        "print(json.dumps({'root': repo_root() is None, 'dags': str(dags_dir()), 'jobs': str(jobs_dir()), "
        "'cql': len(schema_statements(TableLayout(), ['train'], 'SimpleStrategy:1'))}))"
    )
    got = json.loads(_run(py, "-c", probe, cwd=tmp_path).stdout.strip().splitlines()[-1])
    assert got["root"] is True  # not running from the checkout
    assert str(venv) in got["dags"]
    assert str(venv) in got["jobs"]
    assert got["cql"] >= 4
    report = tmp_path / "dagbag.json"
    env = {"AIRFLOW_HOME": str(tmp_path / "af"), "PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    script = Path(__file__).parents[1] / "dags" / "dagbag_report.py"
    _run(py, script, got["dags"], report, cwd=tmp_path, env=env)
    bag = json.loads(report.read_text())
    assert bag["import_errors"] == {}
    assert {"ingest_imagenet", "smoke_services"} <= set(bag["dags"])


def test_wheel_ships_itself_to_spark_executors(venv: Path, tmp_path: Path) -> None:
    probe = (
        "import zipfile; from imgest.spark.submit import package_zip, submit_command; "
        "cmd = submit_command('ingest_cassandra', ['--manifest-dir', 'x'], 'spark://127.0.0.1:7077'); "
        "z = cmd[cmd.index('--py-files') + 1]; names = zipfile.ZipFile(z).namelist(); "
        "print(len(names) == len(set(names)), 'imgest/sql/data_table.cql' in names, "
        "'imgest/sinks/cassandra/client.py' in names, cmd[-3].endswith('imgest/jobs/ingest_cassandra.py'))"
    )
    env = {"IMGEST_HOME": str(tmp_path / "state"), "PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    out = _run(venv / "bin" / "python", "-c", probe, cwd=tmp_path, env=env).stdout.split()
    assert out[-4:] == ["True", "True", "True", "True"]
