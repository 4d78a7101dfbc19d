"""The trigger form's Params, checked through Airflow's own Param validation (no services needed)."""

from __future__ import annotations

import pytest
from airflow.sdk import Param
from airflow.sdk.definitions.param import ParamsDict
from airflow.sdk.exceptions import ParamValidationError

from imgest.core.errors import ConfigError
from imgest.flow.request import SECTIONS
from imgest.flow.request_form import param_specs
from imgest.flow.steps import validate_conf


def _params() -> ParamsDict:
    return ParamsDict({name: Param(**spec) for name, spec in param_specs().items()})


def test_every_default_fits_its_own_schema() -> None:
    resolved = _params().validate()
    assert resolved["source"] is None
    assert resolved["sample"] is False
    assert resolved["table_suffix"] is None
    assert resolved["s3_dest"] is None


def test_defaults_need_only_the_explicit_sample() -> None:
    defaults = _params().validate()
    with pytest.raises(ConfigError) as err:
        validate_conf(defaults)
    assert str(err.value) == (
        "invalid ingest settings: give a source (Source dataset) or set sample: true (Use the generated sample), "
        "not both"
    )
    assert validate_conf({**defaults, "sample": True})["sample"] is True


def test_sections_read_top_to_bottom() -> None:
    order = [spec["section"] for spec in param_specs().values()]
    blocks = [s for i, s in enumerate(order) if i == 0 or order[i - 1] != s]
    assert blocks == list(SECTIONS)  # each section once, in the form's order


def test_every_param_is_titled_typed_and_described() -> None:
    for name, spec in param_specs().items():
        assert spec["title"], name
        assert spec["description"], name
        assert "type" in spec, name  # an untyped enum could be cleared to null in the form
        typed_in = spec["type"] not in (["null", "string"], "boolean") and "enum" not in spec
        if typed_in:  # a value the user types and must not leave empty: the description says so
            assert spec["description"].startswith("Required"), name
        for value in spec.get("enum", []):
            assert value in spec.get("values_display", {value: value}), (name, value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("keyspace", "1bad-ks"),
        ("dataset", "no spaces"),
        ("crop", 5000),
        ("resize", 4),
        ("s3_dest", "http://x/y"),
        ("table_suffix", "-orig"),
        ("split_ratios", "8;2"),
        ("split_balance", "even"),
        ("replication", "SimpleStrategy"),
        ("target", "hdfs"),
        ("target", None),
    ],
)
def test_schema_refuses_values_the_request_cannot_use(name: str, value: object) -> None:
    with pytest.raises(ParamValidationError):
        Param(**param_specs()[name]).resolve(value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("s3_dest", "s3://imgest/inet/v1"),
        ("s3_dest", "/data/inet-shards"),
        ("s3_dest", None),
        ("table_suffix", "_orig"),
        ("split_balance", "1, 2,3"),
        ("split_balance", "random"),
        ("replication", "NetworkTopologyStrategy:dc1=3,dc2=2"),
    ],
)
def test_schema_accepts_what_the_request_accepts(name: str, value: object) -> None:
    assert Param(**param_specs()[name]).resolve(value) == value
    conf = {"sample": True, "target": "shards" if name == "s3_dest" else "cassandra", name: value}
    resolved = validate_conf(conf)[name]
    if name == "s3_dest" and value is None:  # validate resolves an empty destination: $IMGEST_S3_BUCKET's
        import os

        assert resolved == f"s3://{os.environ['IMGEST_S3_BUCKET']}/imagenet-sample"
    else:
        assert resolved == value
