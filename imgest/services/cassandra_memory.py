"""Heap and direct memory of an embedded Cassandra node, sized from the machine as Cassandra's own ``cassandra-env.sh``
does (``calculate_heap_sizes``): the larger of half the memory capped at 1 GiB and a quarter capped at 8 GiB. Direct
memory (what reads, the chunk cache, networking and streaming reserve outside the heap) gets as much as the heap:
the JVM's own default when ``-XX:MaxDirectMemorySize`` is unset, written out so the node's command line says it.

A fixed 1 GiB node (imgest's default before) died of ``OutOfMemoryError: Cannot reserve ... direct buffer memory``
under a split's token-range scan of a table a 1.33 M-row bulk load had just left in 400 SSTables (docs/scale.md).
``IMGEST_CASSANDRA_HEAP`` (``4G``, ``2048M``) sets the main node's heap by hand; the nodes tests start beside it
(authentication, TLS, the ring) keep a fixed small heap.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from imgest.core.errors import ConfigError

MIB = 1 << 20
SMALL_NODE_HEAP = 1024 * MIB  # the side nodes of the tests (auth, TLS, ring): small data, many of them


def machine_memory() -> int:
    """Bytes of memory this machine (or its cgroup, when that is smaller) gives its processes."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            raw = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if raw.isdigit():
            total = min(total, int(raw))
    return total


def env_heap(total: int) -> int:
    """The heap cassandra-env.sh gives a node on a machine of TOTAL bytes (whole MiB)."""
    total_mib = total // MIB
    half = min(total_mib // 2, 1024)
    quarter = min(total_mib // 4, 8192)
    return max(half, quarter) * MIB


def parse_size(raw: str, name: str) -> int:
    """'4G', '2048M', '1536m' as bytes; anything else is an error naming NAME."""
    match = re.fullmatch(r"\s*(\d+)\s*([mMgG])\s*", raw)
    if match is None:
        raise ConfigError(f"{name}={raw!r} must be a size such as 4G or 2048M")
    return int(match.group(1)) * (MIB if match.group(2).lower() == "m" else 1024 * MIB)


def main_node_heap() -> int:
    """The embedded node's heap: IMGEST_CASSANDRA_HEAP, else cassandra-env.sh's size for this machine."""
    raw = os.environ.get("IMGEST_CASSANDRA_HEAP", "")
    return parse_size(raw, "IMGEST_CASSANDRA_HEAP") if raw else env_heap(machine_memory())


def memory_flags(heap: int) -> list[str]:
    """JVM flags for a node of HEAP bytes: a fixed heap (-Xms = -Xmx, as Cassandra sets it), as much direct memory."""
    mib = heap // MIB
    return [f"-Xms{mib}M", f"-Xmx{mib}M", f"-XX:MaxDirectMemorySize={mib}M"]
