"""Readers behind a real TCP proxy (Toxiproxy): correct under added latency, clear errors when the server goes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from imgest.readback.cassandra import CassandraReader, CassandraReadOptions, ReadError
from imgest.readback.check import ReadCheckOptions, cassandra_run, s3_stream_run
from imgest.readback.datasets import cassandra_set, shards_set
from imgest.readback.pipelines import PipelineSpec
from imgest.readback.s3shards import S3ShardStream, S3StreamOptions, ShardReadError
from imgest.services.latency import LatencyProxy
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sinks.cassandra.schema import TableLayout
from imgest.sinks.shards.store import open_store
from tests.conftest import serve
from tests.readback.conftest import DATASET, KEYSPACE

pytestmark = [pytest.mark.services, pytest.mark.slow]


@pytest.fixture(scope="module")
def proxy() -> Iterator[LatencyProxy]:
    yield from serve(LatencyProxy.default())  # type: ignore[misc]


def _through(proxy: LatencyProxy, stored: dict[str, Any]) -> tuple[Any, Any]:
    c = stored["cassandra"]
    c_addr = proxy.proxy("test-cassandra", 29142, f"{c.hosts[0]}:{c.port}")
    s3 = stored["s3_settings"]
    s_addr = proxy.proxy("test-s3", 29433, (s3.endpoint_url or "").split("://", 1)[-1])
    return replace(c, hosts=("127.0.0.1",), port=int(c_addr.rsplit(":", 1)[1])), replace(
        s3, endpoint_url=f"http://{s_addr}"
    )


def test_readers_stay_exact_under_added_latency(proxy: LatencyProxy, stored: dict[str, Any]) -> None:
    cassandra, s3 = _through(proxy, stored)
    proxy.set_rtt("test-cassandra", 20)
    proxy.set_rtt("test-s3", 20)
    with cassandra_session(stored["cassandra"]) as session:
        rs = cassandra_set(session, TableLayout(KEYSPACE), DATASET)
    spec = PipelineSpec(8)
    result = cassandra_run(cassandra, rs, spec, CassandraReadOptions(prefetch_batches=4))
    assert result.ok, result.problems
    assert result.images == len(rs)
    shards = shards_set(open_store(stored["s3"], stored["s3_settings"]))
    result = s3_stream_run(shards, s3, "imgest", "tests/readback", spec, ReadCheckOptions().s3)
    assert result.ok, result.problems
    assert result.images == len(shards)


def test_server_gone_mid_read_is_an_error_naming_host(proxy: LatencyProxy, stored: dict[str, Any]) -> None:
    cassandra, s3 = _through(proxy, stored)
    proxy.set_rtt("test-cassandra", 0)
    with cassandra_session(stored["cassandra"]) as session:
        rs = cassandra_set(session, TableLayout(KEYSPACE), DATASET)
    opts = CassandraReadOptions(batch_size=4, prefetch_batches=1, requests_in_flight=1, rows_per_request=4, retries=2)
    with CassandraReader(cassandra, rs.table, rs.ids, rs.labels, opts) as reader:
        batches = reader.epoch_batches()
        next(batches)
        proxy.set_enabled("test-cassandra", False)
        try:
            with pytest.raises(ReadError) as err:
                for _ in batches:
                    pass
        finally:
            proxy.set_enabled("test-cassandra", True)
    assert cassandra.address in str(err.value)
    assert "failed after retries" in str(err.value)
    proxy.set_enabled("test-s3", False)
    try:
        stream = S3ShardStream(s3, "imgest", ["tests/readback/train-000000.tar"], S3StreamOptions(retries=1))
        with pytest.raises(ShardReadError, match="train-000000") as err:
            list(stream.epoch_batches())
    finally:
        proxy.set_enabled("test-s3", True)
    assert "29433" in str(err.value)
