"""imgest's provider record (issue #52): valid for Airflow's schema, every module it names imports, hooks keep their
connection type, and the DAGs and operators make no network call at import or construction."""

from __future__ import annotations

import importlib
import json
import socket
from importlib import resources
from pathlib import Path

import pytest

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


def test_modules_import_and_dags_build_without_the_network(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With every socket connection refused, each named module imports and each DAG file builds its DAG (operators
    constructed): nothing reaches a store before a task runs."""
    monkeypatch.setenv("IMGEST_DATASETS_FILE", str(tmp_path / "none.toml"))

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network call at import or construction: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    for name in [*HOOKS, *OPERATORS, *DAGS]:
        if name.endswith("refresh_datasets_errors"):
            continue  # raises the datasets file's errors by design (none here: an empty file)
        module = importlib.reload(importlib.import_module(name))
        assert module is not None
    from imgest.dags import ingest_imagenet

    assert len(ingest_imagenet.dag.tasks) >= 15
    templated = {t.task_id: t.template_fields for t in ingest_imagenet.dag.tasks}
    assert "request" in templated["gc"]
    assert "dataset" in templated["lock"]
