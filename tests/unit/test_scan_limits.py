"""The pure parts of bounded scans and node sizing: the per-node limiter under threads, its backing off and growing
back, the replicas a token range meets on a ring, and the embedded node's heap by cassandra-env.sh's rule."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from imgest.core.errors import ConfigError
from imgest.services.cassandra import CassandraServer
from imgest.services.cassandra_memory import env_heap, main_node_heap, memory_flags, parse_size
from imgest.sinks.cassandra.scan import token_ranges
from imgest.sinks.cassandra.scan_limits import NodeLimiter, range_replicas

GIB = 1 << 30


@pytest.mark.parametrize(
    ("machine_gib", "heap_gib"),
    [(1, 0.5), (2, 1), (4, 1), (8, 2), (24, 6), (32, 8), (64, 8), (256, 8)],
)
def test_heap_follows_cassandra_env(machine_gib: float, heap_gib: float) -> None:
    """max(min(half, 1 GiB), min(quarter, 8 GiB)), as calculate_heap_sizes in Cassandra's cassandra-env.sh."""
    assert env_heap(int(machine_gib * GIB)) == int(heap_gib * GIB)


def test_heap_setting_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_size("4G", "X") == 4 * GIB
    assert parse_size("1536m", "X") == 1536 << 20
    with pytest.raises(ConfigError, match="IMGEST_CASSANDRA_HEAP='lots' must be a size"):
        parse_size("lots", "IMGEST_CASSANDRA_HEAP")
    monkeypatch.setenv("IMGEST_CASSANDRA_HEAP", "3G")
    assert main_node_heap() == 3 * GIB
    assert memory_flags(3 * GIB) == ["-Xms3072M", "-Xmx3072M", "-XX:MaxDirectMemorySize=3072M"]


def test_the_embedded_node_is_sized_and_the_side_nodes_stay_small(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IMGEST_HOME", str(tmp_path))
    monkeypatch.setenv("IMGEST_CASSANDRA_HEAP", "2G")
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "jamm-0.4.0.jar").touch()
    main = CassandraServer.default().command("java", lib, tmp_path / "c.yaml")
    assert "-Xmx2048M" in main
    assert "-XX:MaxDirectMemorySize=2048M" in main
    assert "-Dcassandra.jmx.local.port=7199" in main  # JMX, local only: nodetool and the benchmark's sampler
    side = CassandraServer.default(auth=True).command("java", lib, tmp_path / "c.yaml")
    assert "-Xmx1024M" in side
    assert not any(flag.startswith("-Dcassandra.jmx") for flag in side)
    assert sum(flag.startswith("-Xmx") for flag in main) == 1  # none left in the options file


def test_the_limiter_never_exceeds_a_node_bound_under_threads() -> None:
    limiter = NodeLimiter(2, ["a", "b"])
    busy = {"a": 0, "b": 0}
    seen = {"a": 0, "b": 0}
    lock = threading.Lock()

    def work(group: tuple[str, ...]) -> None:
        for _ in range(30):
            limiter.acquire(group)
            with lock:
                for n in group:
                    busy[n] += 1
                    seen[n] = max(seen[n], busy[n])
            time.sleep(0.0005)
            with lock:
                for n in group:
                    busy[n] -= 1
            limiter.release(group, refused=False)

    groups = [("a",), ("b",), ("a", "b"), ("a",), ("b",), ("a", "b"), ("a",), ("b",)]
    threads = [threading.Thread(target=work, args=(g,)) for g in groups]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"a": 2, "b": 2}
    assert limiter.peak == {"a": 2, "b": 2}


def test_a_refusal_halves_a_nodes_allowance_and_good_reads_grow_it_back() -> None:
    limiter = NodeLimiter(4, ["a"])
    limiter.acquire(("a",))
    limiter.release(("a",), refused=True)
    assert limiter._allowed["a"] == 2
    limiter.acquire(("a",))
    limiter.release(("a",), refused=True)
    assert limiter._allowed["a"] == 1
    assert limiter.refusals == 2
    for _ in range(4):  # 4 good reads at an allowance of 1
        limiter.acquire(("a",))
        limiter.release(("a",), refused=False)
    assert limiter._allowed["a"] == 2
    for _ in range(100):
        limiter.acquire(("a",))
        limiter.release(("a",), refused=False)
    assert limiter._allowed["a"] == 4  # never above the bound


class _Token:
    def __init__(self, value: int) -> None:
        self.value = value


def test_a_range_meets_the_replicas_of_every_ring_range_it_overlaps() -> None:
    """Ring tokens -100, 0, 100 owned by A, B, C (RF 1): a token belongs to the first ring token at or after it, and
    past the last one to the first."""
    ring = [_Token(-100), _Token(0), _Token(100)]
    owner = {-100: "A", 0: "B", 100: "C"}
    token_map = SimpleNamespace(
        ring=ring, get_replicas=lambda ks, token: [SimpleNamespace(endpoint=owner[token.value])]
    )
    session = SimpleNamespace(cluster=SimpleNamespace(metadata=SimpleNamespace(token_map=token_map)))
    got = range_replicas(session, "ks", [(-150, -120), (-100, -100), (-99, 0), (-50, 50), (101, 200), (-300, 300)])
    assert got == [("A",), ("A",), ("B",), ("B", "C"), ("A",), ("A", "B", "C")]
    whole = range_replicas(session, "ks", token_ranges(4))
    assert {n for group in whole for n in group} == {"A", "B", "C"}


def test_no_token_map_puts_every_range_in_one_group() -> None:
    session = SimpleNamespace(cluster=SimpleNamespace(metadata=SimpleNamespace(token_map=None)))
    assert range_replicas(session, "ks", token_ranges(3)) == [("*",)] * 3


def test_a_busy_jmx_port_is_named_before_the_node_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Cassandra of the user's own holds 7199 by default: the embedded node says so instead of dying in its log."""
    import socket

    from imgest.core.errors import ServiceError

    def free() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    monkeypatch.setenv("IMGEST_HOME", str(tmp_path))
    monkeypatch.setenv("IMGEST_CASSANDRA_PORT", str(free()))
    monkeypatch.setenv("IMGEST_CASSANDRA_STORAGE_PORT", str(free()))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setenv("IMGEST_CASSANDRA_JMX_PORT", str(taken.getsockname()[1]))
        with pytest.raises(ServiceError, match=r"already taken by another process; .*IMGEST_CASSANDRA_JMX_PORT"):
            CassandraServer.default().launch()
