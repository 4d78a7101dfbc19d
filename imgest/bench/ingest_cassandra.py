"""`imgest bench ingest-cassandra`: our writer against the seed's writer pattern, same blobs, same server.

The baseline is cassandra-dali-plugin's CassandraClassificationWriter.enqueue_image: rows are queued and,
every 32 rows, sent with ``execute_concurrent_with_args`` (data rows, then metadata rows), waiting for each
batch to finish, over a session built like the seed's (token-aware, driver defaults, so the native protocol is
negotiated: v5 on Cassandra 5). imgest's ImageWriter keeps a sliding window of one-request-per-image batches
in flight over imgest's own connection settings. The target (2x) compares the two writers on identical connection
settings (the seed's pattern over imgest's session); the seed over its own session defaults is the second figure,
so the share of the gain that comes from the connection settings is visible.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from imgest.bench.machine import machine_info
from imgest.bench.measure import meets
from imgest.core.quarantine import QuarantineLog
from imgest.core.report import bar_chart, describe_machine, format_table, write_json
from imgest.core.settings import CassandraSettings
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sinks.cassandra.writer import ImageWriter, Row
from imgest.sources.devdata.images import jpeg_bytes
from imgest.transform.image import TransformSpec, transform_image

KEYSPACE = "imgest_bench"
SEED_BATCH = 32


def make_blobs(distinct: int, mode: str, seed: int = 0) -> list[bytes]:
    """Pre-encoded blobs: transformed 224px JPEGs, or whole ImageNet-size JPEGs (UNCHANGED)."""
    hue = np.random.default_rng([seed, 5]).random(3)
    sources = [jpeg_bytes(np.random.default_rng([seed, 9, i]), hue, large=False) for i in range(distinct)]
    if mode == "unchanged":
        return sources
    return [transform_image(data, TransformSpec()).data for data in sources]


def _tables(session: Any) -> None:
    replication = "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    session.execute(f"CREATE KEYSPACE IF NOT EXISTS {KEYSPACE} WITH replication = {replication}")
    for table in ("data_seed", "data_imgest"):
        session.execute(
            f"CREATE TABLE IF NOT EXISTS {KEYSPACE}.{table} (id uuid PRIMARY KEY, label int, data blob)"
            " WITH compression = {'enabled': 'false'}"
        )
    for table in ("metadata_seed", "metadata_imgest"):
        session.execute(
            f"CREATE TABLE IF NOT EXISTS {KEYSPACE}.{table} (id uuid PRIMARY KEY, label int,"
            " or_split text, or_label text)"
        )


def _rows(blobs: list[bytes], rows: int, run: str) -> list[tuple[uuid.UUID, int, bytes]]:
    return [(uuid.uuid5(uuid.NAMESPACE_OID, f"{run}-{i}"), i % 1000, blobs[i % len(blobs)]) for i in range(rows)]


def seed_writer(session: Any, rows: list[tuple[uuid.UUID, int, bytes]]) -> float:
    """The seed's pattern: queue, and every 32 rows execute_concurrent_with_args(data) then (metadata)."""
    from cassandra.concurrent import execute_concurrent_with_args

    data = session.prepare(f"INSERT INTO {KEYSPACE}.data_seed (id, label, data) VALUES (?, ?, ?)")
    meta = session.prepare(f"INSERT INTO {KEYSPACE}.metadata_seed (id, label, or_split, or_label) VALUES (?, ?, ?, ?)")
    queue_data: list[tuple[Any, ...]] = []
    queue_meta: list[tuple[Any, ...]] = []

    def send() -> None:
        if queue_data:
            execute_concurrent_with_args(session, data, queue_data)
            queue_data.clear()
        if queue_meta:
            execute_concurrent_with_args(session, meta, queue_meta, concurrency=SEED_BATCH)
            queue_meta.clear()

    t0 = time.perf_counter()
    for rid, label, blob in rows:
        queue_meta.append((rid, label, "train", str(label)))
        queue_data.append((rid, label, blob))
        if len(queue_meta) % SEED_BATCH == 0:
            send()
    send()
    return time.perf_counter() - t0


def imgest_writer(session: Any, rows: list[tuple[uuid.UUID, int, bytes]], max_in_flight: int) -> float:
    """imgest's ImageWriter: sliding window, one same-partition UNLOGGED batch (data + metadata) per image."""
    data = session.prepare(f"INSERT INTO {KEYSPACE}.data_imgest (id, label, data) VALUES (?, ?, ?)")
    meta = session.prepare(
        f"INSERT INTO {KEYSPACE}.metadata_imgest (id, label, or_split, or_label) VALUES (?, ?, ?, ?)"
    )
    t0 = time.perf_counter()
    with ImageWriter(session, lambda _split: (data, meta), QuarantineLog(), max_in_flight=max_in_flight) as writer:
        for rid, label, blob in rows:
            writer.write(Row(rid, label, blob, "train", (rid, label, "train", str(label)), str(rid)))
    return time.perf_counter() - t0


def _truncate(session: Any) -> None:
    for table in ("data_seed", "data_imgest", "metadata_seed", "metadata_imgest"):
        session.execute(f"TRUNCATE {KEYSPACE}.{table}", timeout=120)


@contextmanager
def seed_session(settings: CassandraSettings) -> Iterator[Any]:
    """A session built the way the seed builds its own: token-aware profile, every other setting default."""
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

    auth = PlainTextAuthProvider(settings.username, settings.password or "") if settings.username else None
    profile = ExecutionProfile(load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy()))
    cluster = Cluster(
        list(settings.hosts), port=settings.port, auth_provider=auth, execution_profiles={EXEC_PROFILE_DEFAULT: profile}
    )
    try:
        yield cluster.connect()
    finally:
        cluster.shutdown()


def _group(mode: str, rows: int, mean_kb: float, rates: dict[str, list[float]]) -> dict[str, Any]:
    """One blob kind's figures. The target compares writers on identical connection settings (the seed's
    pattern over imgest's session); the seed's own session defaults are the second figure."""
    med = {name: statistics.median(values) for name, values in rates.items()}
    target = 2.0 if mode == "jpeg" else None
    same_conn = med["imgest"] / med["seed_on_imgest_conn"]
    return {
        "blobs": f"{mode} ({mean_kb:.0f} KB)",
        "rows": rows,
        "seed_rows_per_s": round(med["seed"], 1),
        "seed_on_imgest_conn_rows_per_s": round(med["seed_on_imgest_conn"], 1),
        "imgest_rows_per_s": round(med["imgest"], 1),
        "rounds_rows_per_s": {name: [round(v, 1) for v in values] for name, values in rates.items()},
        "min_max_rows_per_s": {name: [round(min(v), 1), round(max(v), 1)] for name, v in rates.items()},
        "speedup_same_connection": round(same_conn, 2),
        "speedup_vs_seed_defaults": round(med["imgest"] / med["seed"], 2),
        "imgest_mb_per_s": round(med["imgest"] * mean_kb / 1024, 2),
        "target_speedup_same_connection": target,
        "meets_target": meets(same_conn, target),
    }


def run(settings: CassandraSettings, rows: int, rounds: int, max_in_flight: int) -> dict[str, Any]:
    """Median rows/s of each writer per blob kind; every writer starts on empty tables."""
    groups = []
    with cassandra_session(settings) as session, seed_session(settings) as seed_sess:
        _tables(session)
        writers = {
            "seed": lambda batch: seed_writer(seed_sess, batch),
            "seed_on_imgest_conn": lambda batch: seed_writer(session, batch),
            "imgest": lambda batch: imgest_writer(session, batch, max_in_flight),
        }
        for mode, n in (("jpeg", rows), ("unchanged", max(200, rows // 4))):
            blobs = make_blobs(100, mode)
            rates: dict[str, list[float]] = {name: [] for name in writers}
            for r in range(rounds):
                names = list(writers)[r % 3 :] + list(writers)[: r % 3]  # rotate who goes first
                for name in names:
                    _truncate(session)
                    rates[name].append(n / writers[name](_rows(blobs, n, f"{mode}-{name}-{r}")))
            mean_kb = statistics.mean(len(b) for b in blobs) / 1024
            groups.append(_group(mode, n, mean_kb, rates))
        _truncate(session)
    return {
        "benchmark": "ingest-cassandra",
        "server": settings.address,
        "rounds": rounds,
        "max_in_flight": max_in_flight,
        "seed_batch": SEED_BATCH,
        "connection": {
            "imgest": f"protocol v{settings.protocol_version}, consistency {settings.consistency}, token-aware",
            "seed": "protocol negotiated by the driver (v5 on Cassandra 5), consistency LOCAL_ONE, token-aware",
        },
        "machine": machine_info(),
        "groups": groups,
    }


COLUMNS = [
    ("blobs", "blobs"),
    ("rows", "rows"),
    ("seed_rows_per_s", "seed rows/s"),
    ("seed_on_imgest_conn_rows_per_s", "seed on imgest conn"),
    ("imgest_rows_per_s", "imgest rows/s"),
    ("speedup_same_connection", "speed-up, same conn"),
    ("target_speedup_same_connection", "target"),
    ("speedup_vs_seed_defaults", "vs seed defaults"),
    ("imgest_mb_per_s", "imgest MB/s"),
]


def main(json_out: Path, plot: Path | None, rows: int, rounds: int, max_in_flight: int) -> dict[str, Any]:
    report = run(CassandraSettings.from_env(), rows, rounds, max_in_flight)
    print(describe_machine(report["machine"]))
    print(f"connection settings: imgest {report['connection']['imgest']}; seed defaults {report['connection']['seed']}")
    print(format_table(report["groups"], COLUMNS))
    write_json(json_out, report)
    if plot is not None:
        g = report["groups"]
        bar_chart(
            plot,
            "Cassandra write throughput (same blobs, same server)",
            [x["blobs"] for x in g],
            {
                "seed pattern (flush every 32)": [x["seed_rows_per_s"] for x in g],
                "seed pattern, imgest connection": [x["seed_on_imgest_conn_rows_per_s"] for x in g],
                "imgest writer": [x["imgest_rows_per_s"] for x in g],
            },
            "rows / s",
        )
    return report
