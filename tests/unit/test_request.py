"""The DAG's request refuses reserved or mixed-case names and unsafe destinations in `validate`, with reasons."""

from __future__ import annotations

import pytest

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
