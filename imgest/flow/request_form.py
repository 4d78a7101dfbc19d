"""The trigger form of the `ingest_imagenet` DAG: one Airflow ``Param`` per IngestRequest field, from the field's
own description (imgest.flow.request)."""

from __future__ import annotations

from dataclasses import MISSING, Field, fields
from typing import Any

from imgest.flow.request import IngestRequest


def _schema_type(value: Any) -> str:
    return {bool: "boolean", int: "integer", str: "string"}[type(value)]


# Each Param names draft 7 as its dialect. Airflow validates a Param's schema (jsonschema.check_schema) every time
# it resolves one, and it resolves them all whenever it serializes or compares a DAG's params: about 150 times in
# one `airflow dags test`, and at every parse. Checking against draft 7's metaschema takes 0.3 ms, against the
# default 2020-12 one 0.7 ms; nothing here needs a later draft (type, enum, minimum, maximum, pattern).
PARAM_DIALECT = "http://json-schema.org/draft-07/schema#"


def _param_spec(f: Field) -> dict[str, Any]:
    meta = {"$schema": PARAM_DIALECT, **f.metadata["param"]}
    default = f.default if f.default is not MISSING else None
    if "type" not in meta:  # typed (enums too): the form then flags a cleared value instead of sending null
        meta["type"] = _schema_type(default)
    if not meta.get("description"):
        meta.pop("description")
    return {"default": default, **meta}


def param_specs() -> dict[str, dict[str, Any]]:
    """Keyword arguments of an Airflow ``Param`` for every request field, in form order."""
    return {f.name: _param_spec(f) for f in fields(IngestRequest)}
