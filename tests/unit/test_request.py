"""The DAG's request refuses reserved or mixed-case names and unsafe destinations in `validate`, with reasons."""

from __future__ import annotations

from pathlib import Path

import pytest

from imgest.core import defaults
from imgest.core.errors import ConfigError
from imgest.flow.request import IngestRequest


def test_validate_names_every_problem_with_its_reason() -> None:
    conf = {"sample": True, "target": "cassandra", "keyspace": "table", "table_suffix": "_" + "x" * 22}
    with pytest.raises(ConfigError) as exc:
        IngestRequest.from_conf(conf)
    assert "keyspace 'table' is a reserved CQL word" in str(exc.value)
    conf = {"sample": True, "target": "cassandra", "keyspace": "Adva"}
    with pytest.raises(ConfigError, match="keyspace 'Adva' holds upper-case letters"):
        IngestRequest.from_conf(conf)
    conf = {"sample": True, "target": "cassandra", "table_suffix": "_" + "x" * 22}
    with pytest.raises(ConfigError, match="is 23 characters long; at most 20"):
        IngestRequest.from_conf(conf)


@pytest.mark.parametrize("dest", ["s3://imgest/../../etc", "s3://imgest/a/./b", "s3://imgest//x"])
def test_validate_refuses_dot_segments_in_s3_dest(dest: str) -> None:
    with pytest.raises(ConfigError, match=r"s3_dest: destination .* may not hold empty, '.' or '..' segments"):
        IngestRequest.from_conf({"sample": True, "target": "shards", "s3_dest": dest})


def test_a_plain_request_is_valid() -> None:
    request = IngestRequest.from_conf({"sample": True, "target": "shards", "s3_dest": "s3://imgest/inet/v1"})
    assert request.shard_dest == "s3://imgest/inet/v1"


def test_unchanged_check_travels_from_the_request_to_the_job_arguments(tmp_path: Path) -> None:
    from imgest.flow.steps import shards_job_args
    from imgest.spark.job_options import SHARD_OPTIONS, TRANSFORM_OPTIONS, job_parser

    request = IngestRequest(sample=True, image_mode="unchanged", unchanged_check="header")
    assert request.transform().unchanged_check == "header"
    argv = shards_job_args(request, tmp_path)
    parser = job_parser("pack_shards", None, SHARD_OPTIONS, TRANSFORM_OPTIONS)
    parser.add_argument("--dest")
    args, _ = parser.parse_known_args(argv)
    assert (args.mode, args.unchanged_check) == ("unchanged", "header")
    with pytest.raises(ConfigError, match="unchanged check"):
        IngestRequest(sample=True, image_mode="unchanged", unchanged_check="none").transform()


def test_every_param_is_checked_as_draft_7_and_still_refuses_what_its_schema_refuses() -> None:
    import jsonschema
    from airflow.sdk import Param
    from airflow.sdk.exceptions import ParamValidationError

    from imgest.flow.request_form import param_specs

    for name, spec in param_specs().items():
        schema = {k: v for k, v in spec.items() if k != "default"}
        assert jsonschema.validators.validator_for(schema) is jsonschema.Draft7Validator, name
        jsonschema.Draft7Validator.check_schema(schema)
        assert Param(**spec).resolve(spec["default"], suppress_exception=False) == spec["default"], name
    with pytest.raises(ParamValidationError, match="less than the minimum"):
        Param(**param_specs()["resize"]).resolve(0, suppress_exception=False)


def test_no_bucket_is_a_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shards request without s3_dest takes the connection's bucket, else IMGEST_S3_BUCKET; with neither it is
    refused naming both, never sent to a bucket called imgest. validate_conf writes the resolved destination."""
    from imgest.flow.steps import validate_conf

    monkeypatch.delenv("IMGEST_S3_BUCKET", raising=False)
    conf = {"sample": True, "target": "shards", "dataset": "inet"}
    with pytest.raises(ConfigError, match=r"no shard destination for 'inet'.*\"bucket\".*IMGEST_S3_BUCKET"):
        validate_conf(conf)
    assert validate_conf(conf, bucket="team-data")["s3_dest"] == "s3://team-data/inet"
    unnamed = {"sample": True, "target": "shards"}  # the form's default dataset: the connection's bucket still
    assert validate_conf(unnamed, bucket="team-data")["s3_dest"] == f"s3://team-data/{defaults.DATASET}"
    monkeypatch.setenv("IMGEST_S3_BUCKET", "from-env")
    assert validate_conf(conf)["s3_dest"] == "s3://from-env/inet"
    assert validate_conf(conf, bucket="team-data")["s3_dest"] == "s3://team-data/inet"  # the connection's first
    assert validate_conf({**conf, "s3_dest": "s3://given/x"}, bucket="team-data")["s3_dest"] == "s3://given/x"
    assert validate_conf({**conf, "target": "cassandra"})["s3_dest"] is None  # other targets need no bucket


def test_a_cassandra_run_needs_no_bucket_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan of a Cassandra request with no bucket named anywhere hands out no shard arguments (it used to build
    them for every target, and failed asking for a bucket; found by the hosts harness)."""
    from imgest.flow.steps import scan_step
    from imgest.sources.devdata.sample import SampleSpec, write_sample

    monkeypatch.delenv("IMGEST_S3_BUCKET", raising=False)
    monkeypatch.setenv("IMGEST_HOME", str(tmp_path / "home"))
    write_sample(tmp_path / "src", SampleSpec("imagefolder", classes=2, per_class=2, val_per_class=1, seed=1))
    conf = validate_conf_for(tmp_path / "src")
    scanned = scan_step(conf)
    assert scanned["shards_args"] == []
    assert "--keyspace" in scanned["cassandra_args"]


def validate_conf_for(source: Path) -> dict[str, object]:
    from imgest.flow.steps import validate_conf

    return validate_conf({"source": str(source), "target": "cassandra", "dataset": "nobucket", "keyspace": "nb"})
