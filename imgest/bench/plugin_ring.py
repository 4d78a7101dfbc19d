"""Readers side by side on the local three-node ring, each node behind its own Toxiproxy proxy.

Both drivers (imgest's Python driver, the plugin's C++ driver) find the ring's nodes in ``system.peers``; for
every connection to go through a proxy, each node advertises its proxy as its client address
(``broadcast_rpc_address``, set by ``IMGEST_CASSANDRA_RING_ADVERTISE``): proxies listen on 127.0.0.12-14:9042 and
forward to the nodes on 127.0.0.2-4:9042. The ring is (re)started with that setting when it runs without it.

The sweep's dataset (``imgest bench read``'s 72,000 images) is ingested once into the ring (replication 1: each
node holds a third, so every reader spreads its requests over three nodes), then at each added round trip the
readers read it: imgest's reader (defaults, EPOCHS epochs in a row), the plugin's ``examples`` and ``lfn``
presets (EPOCHS in a row) and its operator defaults (one epoch of the first 8,000 rows, as in the single-node
sweep: it requests one buffer ahead). Rounds alternate the conditions; medians are reported.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from imgest.core.settings import CassandraSettings
from imgest.readback.datasets import ReadSet
from imgest.readback.measure import RunResult

log = logging.getLogger(__name__)
PROXIED = ("127.0.0.12", "127.0.0.13", "127.0.0.14")
KEYSPACE = "bench_ring"
DATASET = "ringsweep"
SMALL_ROWS = 8000


def ring_up() -> Any:
    """The ring, each node advertising its proxy (CassandraRing.up restarts a node that runs with another address),
    and the proxies up."""
    from imgest.services.latency import LatencyProxy
    from imgest.services.ring import CassandraRing

    os.environ["IMGEST_CASSANDRA_RING_ADVERTISE"] = ",".join(PROXIED)
    ring = CassandraRing.default()
    proxy = LatencyProxy.default()
    proxy.up()
    for i, (node, address) in enumerate(zip(ring.nodes, PROXIED, strict=True), start=1):
        proxy.proxy(f"ring-{i}", node.native_port, f"{node.host}:{node.native_port}", listen_host=address)
    log.info(ring.up().message)
    return ring, proxy


def ring_settings(port: int) -> CassandraSettings:
    """Connection settings of the ring through its proxies."""
    return replace(CassandraSettings.from_env(), hosts=PROXIED, port=port, consistency="ONE", local_dc=None)


def ring_set(settings: CassandraSettings, src: Path, work: Path) -> ReadSet:
    """The train rows of the sweep dataset in the ring, ingested (through the proxies, at 0 ms) when missing."""
    from imgest.readback.datasets import cassandra_set
    from imgest.sinks.cassandra.client import cassandra_session
    from imgest.sinks.cassandra.schema import TableLayout

    try:
        with cassandra_session(settings) as session:
            return cassandra_set(session, TableLayout(KEYSPACE), DATASET)
    except Exception as exc:  # no keyspace, no complete version yet: ingest it
        log.info("ingesting the sweep dataset into the ring (%s)", exc)
    shutil.rmtree(work, ignore_errors=True)
    argv = ["ingest", "cassandra", str(src), "--work-dir", str(work), "--dataset", DATASET, "--keyspace", KEYSPACE]
    argv += ["--hosts", ",".join(settings.hosts), "--port", str(settings.port), "--consistency", "ONE"]
    argv += ["--replication", "SimpleStrategy:1", "--master", "local[2]", "--verify"]
    run = subprocess.run([str(Path(sys.executable).with_name("imgest")), *argv], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"imgest {' '.join(argv)} failed ({run.returncode}): {run.stderr[-2000:]}")
    with cassandra_session(settings) as session:
        return cassandra_set(session, TableLayout(KEYSPACE), DATASET)


def head(rs: ReadSet, n: int) -> ReadSet:
    """The first N rows of RS."""
    return replace(rs, rows={k: v[:n] for k, v in rs.rows.items()})


def set_rtt(proxy: Any, rtt_ms: float) -> None:
    """RTT_MS added on every ring node's proxy (see ring_up)."""
    for i in range(1, len(PROXIED) + 1):
        proxy.set_rtt(f"ring-{i}", rtt_ms)


def ring_sweep(
    ring: Any, proxy: Any, src: Path, work: Path, rtts: list[float], rounds: int, epochs: int, batch_size: int
) -> dict[str, Any]:
    """Every reader at every added round trip through the proxies of RING (started by ring_up), ROUNDS times;
    medians per epoch."""
    from imgest.bench.read_sweep import all_epochs_row, epoch_row
    from imgest.peers.crs4_reader import PRESETS, crs4_epochs
    from imgest.readback.check import ReadCheckOptions, cassandra_epochs
    from imgest.readback.pipelines import PipelineSpec

    settings = ring_settings(ring.nodes[0].native_port)
    set_rtt(proxy, 0)
    rs = ring_set(settings, src, work)
    small = head(rs, SMALL_ROWS)
    spec = PipelineSpec(batch_size, mode="raw", verify_after=True)
    opts = ReadCheckOptions(batch_size=batch_size)
    readers: dict[str, Callable[[], list[RunResult]]] = {
        "cassandra": lambda: cassandra_epochs(settings, rs, spec, opts.cassandra, epochs),
        "crs4-plugin-defaults": lambda: crs4_epochs(settings, small, spec, PRESETS["defaults"], 1),
        "crs4-plugin-examples": lambda: crs4_epochs(settings, rs, spec, PRESETS["examples"], epochs),
        "crs4-plugin-lfn": lambda: crs4_epochs(settings, rs, spec, PRESETS["lfn"], epochs),
    }
    results: dict[tuple[float, str], list[list[RunResult]]] = {}
    for round_ in range(rounds):
        for rtt in rtts:
            set_rtt(proxy, rtt)
            for reader, run in readers.items():
                got = run()
                results.setdefault((rtt, reader), []).append(got)
                rates = ", ".join(f"{r.epoch_rate:.0f}" for r in got)
                log.info("ring round %d/%d, %g ms, %s: %s images/s", round_ + 1, rounds, rtt, reader, rates)
    set_rtt(proxy, 0)
    rows = []
    for (rtt, reader), runs in results.items():
        base = {"condition": f"ring, {rtt:g} ms", "rtt_ms": rtt, "reader": reader, "window": "adaptive"}
        for k in range(len(runs[0])):
            rows.append({**base, **epoch_row(k, [r[k] for r in runs])})
        if len(runs[0]) > 1:
            rows.append({**base, **all_epochs_row(runs)})
    return {"nodes": list(ring.hosts), "proxies": list(PROXIED), "replication": 1, "images": len(rs), "rows": rows}
