"""The suite's warm `airflow` CLI (imgest.services.airflow_cli): a command runs in a forked child of a process that
imported Airflow once, with the caller's environment, folder, umask and output, and answers as the script does
(exit code, stdout apart from stderr); a server serves one Airflow configuration."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from imgest.core.paths import dags_dir
from imgest.services import AirflowServer, airflow_cli


def _commands(log: Path) -> list[str]:
    """The commands the warm server whose log is LOG ran."""
    return [m[1] for m in re.finditer(r"command \d+: airflow (.*) \(pid", log.read_text())]


def test_commands_run_warm_as_the_script_runs_them(
    airflow_home: AirflowServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the DAG tests' home, so on the server their `dags test` runs use (no warm-up of its own)."""
    assert os.environ.get(airflow_cli.DIR_ENV), "the suite runs airflow commands warm (tests/conftest.py)"
    monkeypatch.chdir(tmp_path)
    version = airflow_home.airflow("version")
    assert re.fullmatch(r"3\.\d+\.\d+\n", version.stdout), version
    assert version.returncode == 0

    missing = airflow_home.airflow("connections", "get", "nope", check=False)  # stdout and stderr apart, exit 1
    assert (missing.returncode, missing.stdout, missing.stderr.strip()) == (1, "", "Connection not found.")

    home = airflow_home.airflow("config", "get-value", "core", "dags_folder")  # the caller's home and config
    assert home.stdout.strip() == str(dags_dir())
    monkeypatch.setenv("AIRFLOW_CONN_WARM_TEST", "generic://someone@somewhere:1234")  # read by the child
    conn = json.loads(airflow_home.airflow("connections", "get", "warm_test", "-o", "json").stdout)
    assert (conn[0]["host"], str(conn[0]["port"])) == ("somewhere", "1234")

    airflow_home.airflow("connections", "export", "exported.json")  # in the caller's folder, with its umask
    exported = tmp_path / "exported.json"
    assert "cassandra_default" in json.loads(exported.read_text())
    assert stat.S_IMODE(exported.stat().st_mode) & 0o077 == 0  # the umask AirflowServer.airflow asks for

    both = {n: airflow_cli.popen(["dags", "list", "-o", "plain"], airflow_home.env()) for n in ("a", "b")}
    outputs = {n: c.communicate(timeout=120)[0] for n, c in both.items() if c is not None}
    assert set(outputs) == {"a", "b"}  # two at once, each with its own output
    assert all(c.returncode == 0 for c in both.values() if c is not None), outputs
    slow = airflow_cli.popen(["dags", "list", "-o", "plain"], airflow_home.env())
    assert slow is not None
    with pytest.raises(subprocess.TimeoutExpired):
        slow.communicate(timeout=0.01)  # a timeout is honoured while the output is still open
    assert slow.wait(120) == 0
    if slow.stdout is not None:
        slow.stdout.close()

    socket = Path(os.environ[airflow_cli.DIR_ENV]) / f"{airflow_cli.server_key(airflow_home.env())}.sock"
    ran = _commands(socket.with_suffix(".log"))  # every command above ran in the one warm server
    for command in ("version", "connections get nope", "connections get warm_test -o json", "dags list -o plain"):
        assert command in ran, (command, ran)
    assert ran.count("dags list -o plain") >= 3


def test_a_server_serves_one_airflow_configuration() -> None:
    base = {"AIRFLOW_HOME": "/h", "PATH": "/bin", "PYTEST_CURRENT_TEST": "a"}
    key = airflow_cli.server_key(base)
    assert airflow_cli.server_key({**base, "PATH": "/usr/bin", "PYTEST_CURRENT_TEST": "b"}) == key
    assert airflow_cli.server_key({**base, "AIRFLOW_CONN_X": "generic://h", "AIRFLOW_VAR_Y": "1"}) == key
    assert airflow_cli.server_key({**base, "AIRFLOW_HOME": "/other"}) != key  # Airflow reads these at import
    assert airflow_cli.server_key({**base, "AIRFLOW__CORE__DAGS_FOLDER": "/d"}) != key
    assert airflow_cli.server_key({**base, "PYTHONPATH": "/p"}) != key


def test_without_the_variable_commands_run_as_subprocesses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(airflow_cli.DIR_ENV, raising=False)
    assert airflow_cli.run(["version"], dict(os.environ)) is None
    assert airflow_cli.popen(["version"], dict(os.environ)) is None
