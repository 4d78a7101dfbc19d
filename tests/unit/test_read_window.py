"""The adaptive read-ahead window: grows from its slow start to rate x round trip, keeps to its caps."""

from __future__ import annotations

import itertools
import time

import pytest

from imgest.readback.cassandra import CassandraReadOptions
from imgest.readback.window import TRACE_POINTS, AdaptiveWindow


def _round_trip(window: AdaptiveWindow, rtt_s: float, units: float) -> None:
    """A request sent RTT_S ago (with nothing delivered meanwhile) lands with UNITS."""
    sent, delivered = window.stamp()
    window.landed((sent - rtt_s, delivered), units)


def test_window_doubles_per_round_trip_in_its_slow_start() -> None:
    window = AdaptiveWindow("rows", 64, 100_000)
    sizes = []
    for _ in range(4):  # each round trip delivers a full window: the window is what limits the rate
        _round_trip(window, 0.1, window.size)
        sizes.append(window.size)
    stats = window.finish()
    assert sizes[0] >= 125  # startup gain 2 x (64 rows / 0.1 s) x 0.1 s, give or take the clock
    assert all(b >= 1.9 * a for a, b in itertools.pairwise(sizes))
    assert stats.growths == 4
    assert stats.peak == stats.final == sizes[-1]
    assert stats.min_rtt_ms is not None
    assert stats.min_rtt_ms >= 100


def test_window_stays_at_its_floor_on_a_fast_link_and_under_its_cap() -> None:
    fast = AdaptiveWindow("rows", 256, 10_000)
    for _ in range(20):
        _round_trip(fast, 0.001, 16)  # 16 rows per millisecond: 2 x rate x rtt = 32 rows, below the floor
    assert fast.size == 256
    assert fast.finish().growths == 0
    capped = AdaptiveWindow("rows", 64, 300)
    for _ in range(5):
        _round_trip(capped, 0.1, capped.size)
    assert capped.size == 300
    assert capped.finish().capped


def test_memory_bound_lowers_the_cap_and_fixed_windows_never_move() -> None:
    window = AdaptiveWindow("shards", 1, 16)
    for _ in range(4):
        _round_trip(window, 0.2, window.size)
    window.set_cap(3)
    assert window.size == 3
    fixed = AdaptiveWindow("rows", 512, 8192, adaptive=False)
    for _ in range(5):
        _round_trip(fixed, 0.1, 512)
    stats = fixed.finish()
    assert (stats.initial, stats.final, stats.peak, stats.growths) == (512, 512, 512, 0)
    assert stats.samples == 5


def test_a_new_epoch_starts_from_the_last_window_within_floor_and_cap() -> None:
    assert AdaptiveWindow("rows", 256, 8192, start=3000).size == 3000
    assert AdaptiveWindow("rows", 256, 8192, start=10).size == 256
    assert AdaptiveWindow("rows", 256, 2048, start=3000).size == 2048
    assert AdaptiveWindow("rows", 512, 8192, adaptive=False, start=3000).size == 512


def test_cassandra_options_give_the_plugin_named_window() -> None:
    adaptive = CassandraReadOptions(batch_size=32, slow_start=2).window()
    assert adaptive.adaptive
    assert adaptive.size == 64
    assert adaptive.cap == 512 * 64  # requests_in_flight x rows_per_request until row sizes are known
    fixed = CassandraReadOptions(batch_size=32, prefetch_buffers=16).window()
    assert not fixed.adaptive
    assert fixed.size == 512


def test_default_cassandra_window_starts_with_16_requests_of_64_rows() -> None:
    opts = CassandraReadOptions()
    window = opts.window()
    assert opts.rows_per_request == 64
    assert window.size == 1024  # 16 batches of 64: the first round trip carries 16 IN queries of 64 ids
    assert window.size // opts.rows_per_request == 16
    assert window.cap == opts.requests_in_flight * 64


def test_window_trace_follows_the_epoch_and_stays_short() -> None:
    window = AdaptiveWindow("rows", 64, 100_000)
    for i in range(1000):
        _round_trip(window, 0.05, 16 + i % 3)
    stats = window.finish()
    assert TRACE_POINTS <= len(stats.trace) < 2 * TRACE_POINTS
    times = [p[0] for p in stats.trace]
    assert times == sorted(times)
    assert all(p[2] == -1.0 for p in stats.trace)  # the reader did not tell what it had outstanding
    assert stats.trace[-1][1] == pytest.approx(stats.final, abs=0.05)
    told = AdaptiveWindow("rows", 64, 1000, adaptive=False)
    for _ in range(5):
        sent, delivered = told.stamp()
        told.landed((sent - 0.1, delivered), 16, outstanding=48)
    trace = told.finish().trace
    assert [p[2] for p in trace] == [48.0] * 5
    assert all(p[1] == 64 for p in trace)


def test_connections_grow_with_the_bytes_requested_ahead_up_to_the_cap() -> None:
    opts = CassandraReadOptions()
    mb = 2**20
    assert opts.io_threads is None
    assert opts.connections_for(0) == 2  # a fast link: the window's few MB fit two connections
    assert opts.connections_for(5 * mb) == 2
    assert opts.connections_for(12.5 * mb) == 4  # 4 MB per connection
    assert opts.connections_for(200 * mb) == opts.max_io_threads == 8
    assert CassandraReadOptions(io_threads=3).connections_for(200 * mb) == 3
    assert CassandraReadOptions(max_io_threads=5, connection_mb=1).connections_for(100 * mb) == 5


def test_window_holds_its_size_while_the_epoch_drains() -> None:
    window = AdaptiveWindow("rows", 64, 100_000)
    for _ in range(4):
        _round_trip(window, 0.1, window.size)
    grown = window.size
    for _ in range(200):  # the last requests land while nothing more is asked: slow samples, no resize
        sent, delivered = window.stamp()
        window.landed((sent - 0.5, delivered), 1, hold=True)
    assert window.size == grown
    assert window.finish().final == grown
    assert AdaptiveWindow("rows", 64, 100_000, start=grown).size == grown  # the next epoch starts from it


def test_a_jump_holds_through_the_slow_start_then_the_window_follows_its_samples() -> None:
    window = AdaptiveWindow("rows", 64, 100_000)
    window.jump(2000)  # say the bandwidth the reader opened for x the round trip it timed
    assert window.size == 2000
    assert window.stats.growths == 1
    sizes = []
    for _ in range(10):  # slow samples (16 rows per 1 ms round trip): no reason to hold 2,000 rows after the start
        _round_trip(window, 0.001, 16)
        sizes.append(window.size)
        time.sleep(0.002)  # a round trip passes, so the slow start can see the rate stay flat
        if not window.in_startup:
            break
    assert sizes[0] == 2000  # held while the slow start lasts
    assert not window.in_startup
    assert window.size == 64  # then the samples decide: back to the floor
    capped = AdaptiveWindow("rows", 64, 500)
    capped.jump(2000)
    assert capped.size == 500
    fixed = AdaptiveWindow("rows", 64, 100_000, adaptive=False)
    fixed.jump(2000)
    assert fixed.size == 64
    window.jump(5000)  # past the slow start: nothing
    assert window.size == 64


def test_finish_with_restart_keeps_the_window_and_begins_new_stats() -> None:
    window = AdaptiveWindow("rows", 64, 100_000)
    for _ in range(3):
        _round_trip(window, 0.1, window.size)
    grown = window.size
    first = window.finish(restart=True)
    assert first.samples == 3
    assert first.final == grown
    assert window.size == grown  # the next epoch goes on from the same window and estimates
    assert window.stats is not first
    assert (window.stats.samples, window.stats.initial, window.stats.growths) == (0, grown, 0)
    _round_trip(window, 0.1, 16)
    second = window.finish(restart=True)
    assert second.samples == 1
    assert second.min_rtt_ms is not None
    assert second.min_rtt_ms >= 100  # the estimates carried over
    assert len(second.trace) == 1


def test_samples_of_a_consumer_that_does_not_keep_up_neither_shrink_the_window_nor_end_its_slow_start() -> None:
    window = AdaptiveWindow("rows", 64, 100_000)
    for _ in range(3):
        _round_trip(window, 0.001, window.size)
        time.sleep(0.002)
    grown = window.size
    for _ in range(6):  # round trips of slow samples while most of the window waits to be taken
        sent, delivered = window.stamp()
        window.landed((sent - 0.001, delivered), 1, app_limited=True)
        assert window.size >= grown
        time.sleep(0.002)
    assert window.in_startup  # no plateau seen: the consumer's pace says nothing about the path
    for _ in range(10):  # the same samples with the path holding the rate back: the slow start ends
        _round_trip(window, 0.001, 1)
        time.sleep(0.002)
        if not window.in_startup:
            break
    assert not window.in_startup


def test_max_window_mb_cuts_a_large_slow_start_down_to_one_batch() -> None:
    # slow_start 16 x batch 256 = 4,096 rows: about 450 MB of ImageNet-size JPEGs, over the 256 MB bound
    window = CassandraReadOptions(batch_size=256).window()
    assert window.size == 4096
    window.set_cap(256 * 2**20 / 110_000)  # rows of 110 KB that fit 256 MB: 2,440
    assert window.size == window.cap == 256 * 2**20 / 110_000
    window.set_cap(100)  # below a batch: the window keeps one batch, or no batch could ever be made
    assert window.size == window.cap == 256
    fixed = CassandraReadOptions(batch_size=256, prefetch_buffers=4).window()
    fixed.set_cap(100)
    assert fixed.size == 1024  # a fixed window is what the user asked for
