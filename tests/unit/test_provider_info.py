"""imgest's provider record (issue #52): valid for Airflow's schema, every module it names imports, hooks keep their
connection type, and the DAGs and operators make no network call at import or construction."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

from imgest.operators.provider_info import DAGS, HOOKS, OPERATORS, get_provider_info


def test_the_record_is_valid_for_airflows_schema() -> None:
    import jsonschema

    schema = json.loads((resources.files("airflow") / "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    assert info["package-name"] == "imgest"
    assert info["hooks"][0]["python-modules"] == HOOKS
    assert info["operators"][0]["python-modules"] == OPERATORS
    assert info["dags"] == DAGS
    assert "connection-types" not in info  # the hooks read Airflow's own cassandra and aws connections


def test_hooks_keep_their_connection_types() -> None:
    from imgest.operators.hooks import ImgestCassandraHook, ImgestS3Hook

    assert (ImgestCassandraHook.conn_type, ImgestS3Hook.conn_type) == ("cassandra", "aws")
    assert ImgestCassandraHook.hook_name
    assert ImgestS3Hook.hook_name


PROBE = """
import importlib, json, socket, sys

def refuse(*args, **kwargs):
    raise AssertionError(f"network call at import or construction: {args}")

socket.socket.connect = refuse
socket.create_connection = refuse
for name in sys.argv[1:]:
    importlib.import_module(name)
from imgest.dags import ingest_imagenet

print(json.dumps({t.task_id: list(t.template_fields) for t in ingest_imagenet.dag.tasks}))
"""


def test_modules_import_and_dags_build_without_the_network(tmp_path: Path) -> None:
    """In a fresh process whose every socket connection is refused, each named module imports and each DAG file
    builds its DAG (operators constructed): nothing reaches a store before a task runs."""
    names = [n for n in (*HOOKS, *OPERATORS, *DAGS) if not n.endswith("refresh_datasets_errors")]  # raises by design
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "IMGEST_DATASETS_FILE": str(tmp_path / "none.toml")}
    proc = subprocess.run([sys.executable, "-c", PROBE, *names], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    templated = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(templated) >= 15
    assert "request" in templated["gc"]
    assert "dataset" in templated["lock"]
