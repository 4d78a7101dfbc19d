"""The adaptive read-ahead window: grows from its slow start to rate x round trip, keeps to its caps."""

from __future__ import annotations

import itertools

from imgest.readback.cassandra import CassandraReadOptions
from imgest.readback.window import AdaptiveWindow


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
    assert adaptive.cap == 512 * 16  # requests_in_flight x rows_per_request until row sizes are known
    fixed = CassandraReadOptions(batch_size=32, prefetch_buffers=16).window()
    assert not fixed.adaptive
    assert fixed.size == 512
