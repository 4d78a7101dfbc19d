"""Readers behind a real TCP proxy (Toxiproxy): correct under added latency, clear errors when the server goes,
and a read-ahead window that grows by itself when the server is far away."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from imgest.readback.cassandra import CassandraReader, CassandraReadOptions, epoch_order
from imgest.readback.cassandra_base import ReadError
from imgest.readback.check import ReadCheckOptions, cassandra_run
from imgest.readback.check_s3 import s3_stream_run
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
    result = cassandra_run(cassandra, rs, spec, CassandraReadOptions(prefetch_buffers=4))
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
    opts = CassandraReadOptions(batch_size=4, prefetch_buffers=1, requests_in_flight=1, rows_per_request=4, retries=2)
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


def _ids_of(reader: CassandraReader) -> list[str]:
    return [i for _, _, ids in reader.epoch_batches() for i in ids]


@pytest.mark.parametrize("ooo", [True, False])
def test_cassandra_window_grows_under_latency_and_reads_each_row_once(
    proxy: LatencyProxy, stored: dict[str, Any], ooo: bool
) -> None:
    cassandra, _ = _through(proxy, stored)
    proxy.set_rtt("test-cassandra", 60)
    with cassandra_session(stored["cassandra"]) as session:
        rs = cassandra_set(session, TableLayout(KEYSPACE), DATASET)
    opts = CassandraReadOptions(batch_size=4, slow_start=1, rows_per_request=2, ooo=ooo, seed=7)
    with CassandraReader(cassandra, rs.table, rs.ids, rs.labels, opts) as reader:
        got = _ids_of(reader)
        stats = reader.window_stats
    want = [rs.ids[i].decode() for i in epoch_order(rs.ids, rs.labels, opts, 0)]
    assert sorted(got) == sorted(want)
    assert len(set(got)) == len(want) == stored["train"]
    if not ooo:
        assert got == want  # in-order mode keeps the epoch's seeded order
    assert stats is not None
    assert stats.adaptive
    assert stats.unit == "rows"
    assert stats.initial == 4  # slow start: one batch
    assert stats.growths >= 1, stats
    assert stats.peak >= 2 * stats.initial, stats
    assert stats.min_rtt_ms is not None
    assert stats.min_rtt_ms >= 55  # the proxy's round trip was seen


def test_fixed_prefetch_buffers_keep_their_window(proxy: LatencyProxy, stored: dict[str, Any]) -> None:
    cassandra, _ = _through(proxy, stored)
    proxy.set_rtt("test-cassandra", 30)
    with cassandra_session(stored["cassandra"]) as session:
        rs = cassandra_set(session, TableLayout(KEYSPACE), DATASET)
    opts = CassandraReadOptions(batch_size=4, prefetch_buffers=2, rows_per_request=2)
    with CassandraReader(cassandra, rs.table, rs.ids, rs.labels, opts) as reader:
        got = _ids_of(reader)
        stats = reader.window_stats
    assert len(set(got)) == len(got) == stored["train"]
    assert stats is not None
    assert not stats.adaptive
    assert stats.initial == stats.final == stats.peak == 8
    assert stats.growths == 0


def test_s3_read_ahead_grows_under_latency_and_reads_each_sample_once(
    proxy: LatencyProxy, stored: dict[str, Any]
) -> None:
    _, s3 = _through(proxy, stored)
    proxy.set_rtt("test-s3", 60)
    shards = shards_set(open_store(stored["s3"], stored["s3_settings"]))
    keys = [f"tests/readback/{s}" for s in shards.shards]
    stream = S3ShardStream(s3, "imgest", keys, S3StreamOptions(batch_size=4, slow_start=1))
    got = [k for _, _, batch_keys, _ in stream.epoch_batches() for k in batch_keys]
    assert len(got) == len(set(got)) == len(shards)
    stats = stream.window_stats
    assert stats is not None
    assert stats.adaptive
    assert stats.unit == "shards"
    assert stats.initial == 1
    assert stats.samples == len(keys)  # one sample per GET
    assert stats.growths >= 1, stats
    assert stats.peak >= 2, stats
    assert stats.min_rtt_ms is not None
    assert stats.min_rtt_ms >= 55  # the proxy's round trip was seen
