"""The suite's warm `airflow` CLI (imgest.services.airflow_cli): a command runs in a forked child of a process that
imported Airflow once, with the caller's environment, folder, umask and output, and answers as the script does
(exit code, stdout apart from stderr); another Airflow home gets a server of its own."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from imgest.core.paths import dags_dir
from imgest.services import AirflowServer, airflow_cli


def _commands(folder: Path) -> list[str]:
    """The commands the warm servers under FOLDER ran, from their logs."""
    return [
        m[1]
        for p in sorted(folder.glob("*.log"))
        for m in re.finditer(r"command \d+: airflow (.*) \(pid", p.read_text())
    ]


@pytest.mark.slow  # imports Airflow in two servers (seconds of CPU each)
def test_commands_run_warm_as_the_script_runs_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "cli"
    monkeypatch.setenv(airflow_cli.DIR_ENV, str(folder))
    monkeypatch.chdir(tmp_path)
    one = AirflowServer(home=tmp_path / "one", port=18601)
    one.write_config()
    try:
        version = one.airflow("version")
        assert re.fullmatch(r"3\.\d+\.\d+\n", version.stdout), version
        assert version.returncode == 0

        missing = one.airflow("connections", "get", "nope", check=False)  # stdout and stderr apart, exit 1
        assert (missing.returncode, missing.stdout, missing.stderr.strip()) == (1, "", "Connection not found.")

        home = one.airflow("config", "get-value", "core", "dags_folder")  # the caller's AIRFLOW_HOME and config
        assert home.stdout.strip() == str(dags_dir())
        monkeypatch.setenv("AIRFLOW__CORE__DAGS_FOLDER", str(tmp_path))  # another setting: another server
        assert one.airflow("config", "get-value", "core", "dags_folder").stdout.strip() == str(tmp_path)
        monkeypatch.delenv("AIRFLOW__CORE__DAGS_FOLDER")

        one.airflow("db", "migrate")
        db = one.home / "airflow.db"
        assert db.is_file()
        assert stat.S_IMODE(db.stat().st_mode) & 0o077 == 0  # the umask the caller asked for (0o077)

        both = {n: airflow_cli.popen(["dags", "list", "-o", "plain"], one.env()) for n in ("a", "b")}
        outputs = {n: c.communicate(timeout=120)[0] for n, c in both.items() if c is not None}
        assert set(outputs) == {"a", "b"}  # two at once, each with its own output
        assert all(c.returncode == 0 for c in both.values() if c is not None), outputs
    finally:
        stopped = airflow_cli.stop_all(folder)
    assert stopped == 2  # one server per configuration
    ran = _commands(folder)
    assert ran.count("version") == 1
    assert ran.count("dags list -o plain") == 2
    assert ran.count("config get-value core dags_folder") == 2
    assert not list(folder.glob("*.sock"))


def test_without_the_variable_commands_run_as_subprocesses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(airflow_cli.DIR_ENV, raising=False)
    assert airflow_cli.run(["version"], dict(os.environ)) is None
    assert airflow_cli.popen(["version"], dict(os.environ)) is None
