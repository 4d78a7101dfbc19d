"""The Cassandra reader's connections behind a real TCP proxy (Toxiproxy): as many as the round trip calls for by
default (one connection carries only so much per round trip), a fixed number when io_threads is given, and every
row read once over them; the window's course over the epoch is kept in its stats.

The round trip the reader times depends on the machine's load as well as on the proxy, so the tests check the
reader's decision against the round trip it timed (which cannot be below what the proxy adds), computed here
from the options, not the figure a quiet machine would time."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from imgest.readback.cassandra import CassandraReader, CassandraReadOptions
from imgest.readback.datasets import cassandra_set
from imgest.services.latency import LatencyProxy
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sinks.cassandra.schema import TableLayout
from tests.conftest import serve
from tests.readback.conftest import DATASET, KEYSPACE

pytestmark = [pytest.mark.services, pytest.mark.slow]
PROXY = "test-cassandra-conns"


@pytest.fixture(scope="module")
def proxy() -> Iterator[LatencyProxy]:
    yield from serve(LatencyProxy.default())  # type: ignore[misc]


def _read(proxy: LatencyProxy, stored: dict[str, Any], rtt_ms: float, opts: CassandraReadOptions) -> dict[str, Any]:
    c = stored["cassandra"]
    addr = proxy.proxy(PROXY, 29152, f"{c.hosts[0]}:{c.port}")
    through = replace(c, hosts=("127.0.0.1",), port=int(addr.rsplit(":", 1)[1]))
    proxy.set_rtt(PROXY, rtt_ms)
    try:
        with cassandra_session(c) as session:
            rs = cassandra_set(session, TableLayout(KEYSPACE), DATASET)
        with CassandraReader(through, rs.table, rs.ids, rs.labels, opts) as reader:
            opened, rtt = reader.connections, reader.rtt
            got = [i for _, _, ids in reader.epoch_batches() for i in ids]
            return {"opened": opened, "rtt": rtt, "got": got, "rows": len(rs), "stats": reader.window_stats}
    finally:
        proxy.set_rtt(PROXY, 0)


def _called_for(opts: CassandraReadOptions, rtt_s: float) -> int:
    """Connections the round trip RTT_S calls for at open: what open_mb_s keeps in flight over it, one connection
    per connection_mb, at least 2 and at most max_io_threads."""
    in_flight = rtt_s * opts.open_mb_s * 1e6
    return max(2, min(opts.max_io_threads, math.ceil(in_flight / (opts.connection_mb * 2**20))))


def test_far_server_gets_more_connections_and_each_row_once(proxy: LatencyProxy, stored: dict[str, Any]) -> None:
    opts = CassandraReadOptions(batch_size=4, slow_start=1, rows_per_request=2)
    out = _read(proxy, stored, 60, opts)
    assert out["rtt"] >= 0.059  # the proxy delays each direction by 30 ms: no machine times less
    # 60 ms x 400 MB/s = 24 MB to keep in flight, one connection per 4 MiB: 6; a loaded machine times a longer
    # round trip, and the reader opens what that one calls for
    assert _called_for(opts, 0.060) == 6
    assert out["opened"] == _called_for(opts, out["rtt"]) >= 6
    assert sorted(out["got"]) == sorted(set(out["got"]))
    assert len(out["got"]) == out["rows"] == stored["train"]
    stats = out["stats"]
    assert stats is not None
    assert stats.trace, stats
    assert all(point[2] >= 0 for point in stats.trace)  # the reader told what it had requested ahead
    assert stats.trace[-1][1] == pytest.approx(stats.final, abs=0.05)  # the trace keeps one decimal


def test_near_server_keeps_two_connections_and_io_threads_fixes_them(
    proxy: LatencyProxy, stored: dict[str, Any]
) -> None:
    opts = CassandraReadOptions(batch_size=4, rows_per_request=2)
    near = _read(proxy, stored, 0, opts)
    assert near["opened"] == _called_for(opts, near["rtt"])  # 2 below 21 ms, what a loaded machine may time
    assert _called_for(opts, 0.020) == 2
    assert len(set(near["got"])) == len(near["got"]) == stored["train"]
    fixed = _read(proxy, stored, 60, CassandraReadOptions(batch_size=4, rows_per_request=2, io_threads=3))
    assert fixed["opened"] == 3
    assert len(set(fixed["got"])) == len(fixed["got"]) == stored["train"]
