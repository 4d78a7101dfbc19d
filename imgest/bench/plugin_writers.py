"""Writers side by side: the cassandra-dali-plugin's ``extract_spark.py`` (as its README runs it) against
``imgest ingest cassandra --mode unchanged --verify`` on the same source tree, same Spark ``local[2]``.

Each writer runs as the user runs it (a subprocess: spark-submit for the plugin, the ``imgest`` command for us),
into fresh tables, at two sizes of the tree (all of it and an eighth), ROUNDS times alternating. The tree is the
readers' train images, each under ``--writer-copies`` names (hard links; 32,000 images by default), so that the
start-up costs of both sides (Spark, the JVMs, the schema) weigh as they would in a run of real length. Reported per
writer: images/s at each size, the fixed cost and the steady rate from a line through the two sizes, CPU per
row of the Cassandra server (while the writer runs and until the merges running when it ends are done; every
writer's keyspace is dropped before the next writer runs, so that nothing one leaves behind falls into the next
one's run) and of the writer's process tree, and for imgest the job's phase seconds.

imgest runs twice: with its default check (every JPEG's entropy data decoded, so a truncated or corrupt file is
quarantined instead of stored) and with ``--unchanged-check header`` (the closest to the plugin, which checks
nothing). The report also gives the CPU-bound ceiling: with every core busy, no writer through the same server
can exceed ``cores / (server CPU per row)`` images/s, whatever its client costs.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from imgest.core.settings import CassandraSettings

WRITER_KEYSPACE = "bench_plugin_writer"
SIDES = (
    "plugin",
    "imgest",
    "imgest-header",
    "imgest-helper",
    "imgest-helper-header",
    "imgest-bulk",
    "imgest-bulk-header",
)
IMGEST_SIDES = SIDES[1:]


def count_rows(settings: CassandraSettings, table: str) -> int:
    """Rows of TABLE (one per partition) by a token-range scan of its distinct ids (no count(*): it times out on
    blob tables; no SELECT id: the node reads each row's blob for it)."""
    from imgest.sinks.cassandra.client import cassandra_session
    from imgest.sinks.cassandra.scan import count_partitions

    with cassandra_session(settings) as session:
        return count_partitions(session, table)


def plugin_writer(examples: Path, src: Path, settings: CassandraSettings, keyspace: str) -> dict[str, Any]:
    """The plugin's extract_spark.py as its README runs it, into fresh tables of KEYSPACE; wall time and rows."""
    from imgest.peers.crs4_scripts import plugin_tables_cql
    from imgest.sinks.cassandra.client import cassandra_session
    from imgest.spark.conf import submit_env
    from imgest.spark.distribution import spark_submit

    with cassandra_session(settings) as session:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
        for statement in plugin_tables_cql(examples, keyspace):
            session.execute(statement, timeout=60)
    folder = examples / "imagenette"
    cmd = [spark_submit(), "--master", "local[2]", "--conf", "spark.default.parallelism=10"]
    cmd += ["--py-files", "extract_common.py", "extract_spark.py", str(src), "--split-subdir=train"]
    cmd += ["--data-table", f"{keyspace}.data_train", "--metadata-table", f"{keyspace}.metadata_train"]
    t0 = time.perf_counter()
    run = subprocess.run(cmd, cwd=folder, env=submit_env("local[2]"), capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if run.returncode != 0:
        raise RuntimeError(f"the plugin's extract_spark.py failed ({run.returncode}): {run.stderr[-2000:]}")
    count = partial(count_rows, settings, f"{keyspace}.data_train")
    return {"writer": "crs4 extract_spark.py (UNCHANGED, parallelism 10)", "seconds": round(wall, 2), "count": count}


def imgest_writer(
    src: Path, work: Path, settings: CassandraSettings, keyspace: str, check: str = "decode", path: str = "cql"
) -> dict[str, Any]:
    """`imgest ingest cassandra --mode unchanged --unchanged-check CHECK --write-path PATH --verify` of SRC into
    fresh tables, run as a command; wall time (scan, job and verification), rows and the job's phase seconds."""
    from imgest.sinks.cassandra.client import cassandra_session

    with cassandra_session(settings) as session:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
    shutil.rmtree(work, ignore_errors=True)
    argv = ["ingest", "cassandra", str(src), "--work-dir", str(work), "--dataset", "writer", "--keyspace", keyspace]
    argv += ["--master", "local[2]", "--mode", "unchanged", "--unchanged-check", check, "--verify"]
    argv += ["--write-path", path]
    argv += ["--port", str(settings.port)]
    imgest = Path(sys.executable).with_name("imgest")
    t0 = time.perf_counter()
    run = subprocess.run([str(imgest), *argv], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if run.returncode != 0:
        raise RuntimeError(f"imgest {' '.join(argv)} failed ({run.returncode}): {run.stderr[-2000:]}")
    count = partial(count_rows, settings, f"{keyspace}.data")
    summary = json.loads((work / "ingest_cassandra.json").read_text())
    name = f"imgest ingest cassandra --mode unchanged --verify --write-path {path}"
    name += "" if check == "decode" else f" --unchanged-check {check}"
    return {"writer": name, "seconds": round(wall, 2), "count": count, "phase_seconds": summary.get("phase_seconds")}


def settle(settings: CassandraSettings, quiet_s: float = 3.0, limit_s: float = 600.0) -> float:
    """Seconds until the node has run no compaction for QUIET_S in a row (``system_views.sstable_tasks``): the
    merges already running when a writer ends (the CQL path's, started by its flushes) count as that writer's.
    Merges the node starts later are not waited for: compaction given back by a schema change (the bulk path's)
    starts at the node's next background check, up to a minute on, and the next writer's run drops the keyspace
    first (``clear_keyspaces``), so they are counted for no writer."""
    from imgest.sinks.cassandra.client import cassandra_session

    t0 = last_busy = time.monotonic()
    with cassandra_session(settings) as session:
        while time.monotonic() - last_busy < quiet_s and time.monotonic() - t0 < limit_s:
            if list(session.execute("SELECT kind FROM system_views.sstable_tasks")):
                last_busy = time.monotonic()
            time.sleep(0.25)
    return round(time.monotonic() - t0, 1)


def clear_keyspaces(settings: CassandraSettings) -> None:
    """Drop every writer's keyspace before the next writer runs, outside its measured window: a keyspace left
    behind would compact during the next writer's run."""
    from imgest.sinks.cassandra.client import cassandra_session

    with cassandra_session(settings) as session:
        for suffix in ("_crs4", "_imgest"):
            session.execute(f"DROP KEYSPACE IF EXISTS {WRITER_KEYSPACE}{suffix}", timeout=120)


def with_cpu(
    run: Callable[[], dict[str, Any]], server_pid: int | None, wait: Callable[[], float] | None = None
) -> dict[str, Any]:
    """RUN() (a writer returning its record) with the CPU per row of the server and of this process's tree; the
    server's counted until WAIT() returns (the node done with what the writer left it), the seconds it took
    recorded apart from the writer's own. A record's "count" (a callable) gives its rows once the window closed."""
    from imgest.bench.measure import TreeSampler, tree_seconds

    server0 = tree_seconds([server_pid]) if server_pid else 0.0
    with TreeSampler([os.getpid()]) as tree:
        out = run()
    settled = wait() if wait else 0.0
    server = (tree_seconds([server_pid]) - server0) if server_pid else 0.0
    count = out.pop("count", None)
    if count is not None:  # the bench's own count of the stored rows, after the window: its reads are no writer's
        out["rows"] = count()
    rows = max(1, out["rows"])
    return {
        **out,
        "server_settle_s": settled,
        "server_cpu_ms_per_row": round(server / rows * 1000, 3),
        "client_cpu_ms_per_row": round(tree.seconds() / rows * 1000, 3),
    }


def subset(src: Path, out: Path, fraction: int) -> Path:
    """OUT/train holding every FRACTION-th file of each class folder of SRC/train (hard links), made once."""
    if not (out / "train").is_dir():
        tmp = out.with_name(out.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        for cls in sorted(p for p in (src / "train").iterdir() if p.is_dir()):
            (tmp / "train" / cls.name).mkdir(parents=True)
            for f in sorted(cls.iterdir())[::fraction]:
                os.link(f, tmp / "train" / cls.name / f.name)
        tmp.rename(out)
    return out


def linked_copies(train: Path, out: Path, copies: int) -> Path:
    """OUT/train holding each file of TRAIN's class folders under COPIES names (hard links, pack_data.link_copies:
    ``a.JPEG``, ``a_r1.JPEG``, ...), made once. The same bytes read again by name, as the page cache serves both
    writers."""
    from imgest.bench.pack_data import link_copies

    if not (out / "train").is_dir():
        tmp = out.with_name(out.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        link_copies(train, tmp / "train", copies * sum(1 for p in train.rglob("*") if p.is_file()))
        tmp.rename(out)
    return out


def _median_record(results: list[dict[str, Any]]) -> dict[str, Any]:
    seconds = statistics.median(r["seconds"] for r in results)
    best = min(results, key=lambda r: abs(r["seconds"] - seconds))
    out = {**best, "seconds": seconds, "all_seconds": [r["seconds"] for r in results]}
    out["images_per_s"] = round(out["rows"] / seconds, 1)
    for key in ("server_cpu_ms_per_row", "client_cpu_ms_per_row", "server_settle_s"):
        if all(key in r for r in results):
            out[key] = statistics.median(r[key] for r in results)
    return out


def steady(small: dict[str, Any], full: dict[str, Any]) -> dict[str, float]:
    """Fixed seconds and steady images/s of the line through the two sizes, and the same fit of the server's and
    the writer's CPU: milliseconds per further row (``*_marginal``) apart from the per-job seconds (schema, version
    record, JVM and Spark start-up, verification)."""
    extra_rows = max(1, full["rows"] - small["rows"])
    per_row = (full["seconds"] - small["seconds"]) / extra_rows
    fixed = max(0.0, full["seconds"] - per_row * full["rows"])
    out = {"fixed_s": round(fixed, 2), "steady_images_per_s": round(1 / per_row, 1) if per_row > 0 else 0.0}
    for key in ("server_cpu_ms_per_row", "client_cpu_ms_per_row"):
        if key in full and key in small:
            marginal = (full[key] * full["rows"] - small[key] * small["rows"]) / extra_rows
            out[f"{key}_marginal"] = round(marginal, 3)
            out[f"{key.split('_')[0]}_cpu_fixed_s"] = round((full[key] - marginal) * full["rows"] / 1000, 2)
    return out


def writers(
    examples: Path, src: Path, work: Path, settings: CassandraSettings, rounds: int, sides: tuple[str, ...] = SIDES
) -> dict[str, Any]:
    """Every writer of SIDES (the plugin's always) at two sizes of SRC, ROUNDS times alternating; medians, fits,
    ratios, ceiling."""
    unknown = set(sides) - set(SIDES)
    if unknown:
        raise ValueError(f"unknown writers {sorted(unknown)}; known: {', '.join(SIDES)}")
    sides = tuple(s for s in SIDES if s in sides or s == "plugin")
    from imgest.services import CassandraServer

    server = CassandraServer.default().process.pid()
    small_src = subset(src, src.with_name(src.name + "-eighth"), 8)
    run_one: dict[str, Callable[[Path], dict[str, Any]]] = {
        "plugin": lambda s: plugin_writer(examples, s, settings, WRITER_KEYSPACE + "_crs4"),
        "imgest": lambda s: imgest_writer(s, work, settings, WRITER_KEYSPACE + "_imgest"),
        "imgest-header": lambda s: imgest_writer(s, work, settings, WRITER_KEYSPACE + "_imgest", "header"),
        "imgest-helper": lambda s: imgest_writer(s, work, settings, WRITER_KEYSPACE + "_imgest", path="cql-helper"),
        "imgest-helper-header": lambda s: imgest_writer(
            s, work, settings, WRITER_KEYSPACE + "_imgest", "header", "cql-helper"
        ),
        "imgest-bulk": lambda s: imgest_writer(s, work, settings, WRITER_KEYSPACE + "_imgest", path="bulk"),
        "imgest-bulk-header": lambda s: imgest_writer(s, work, settings, WRITER_KEYSPACE + "_imgest", "header", "bulk"),
    }
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _ in range(rounds):
        for size, tree in (("small", small_src), ("full", src)):
            for side in sides:
                clear_keyspaces(settings)
                os.sync()  # the writer before's bytes on disk, outside the window: its writeback is not this one's
                record = with_cpu(partial(run_one[side], tree), server, partial(settle, settings))
                runs.setdefault((side, size), []).append(record)
    out: dict[str, Any] = {"sizes": {}}
    for side in sides:
        small, full = _median_record(runs[(side, "small")]), _median_record(runs[(side, "full")])
        out[side] = {**full, **steady(small, full), "small": small}
        out["sizes"][side] = [small["rows"], full["rows"]]
    plugin = out["plugin"]
    for side in sides[1:]:
        out[f"ratio_{side}"] = round(out[side]["images_per_s"] / plugin["images_per_s"], 2)
        steady_plugin = plugin["steady_images_per_s"] or 1
        out[f"steady_ratio_{side}"] = round(out[side]["steady_images_per_s"] / steady_plugin, 2)
    if "imgest" not in out:
        return out
    out["ratio"] = out["ratio_imgest"]
    cores = os.cpu_count() or 1
    ceiling = cores / (out["imgest"]["server_cpu_ms_per_row"] / 1000) if out["imgest"]["server_cpu_ms_per_row"] else 0
    out["cpu_bound_ceiling"] = {
        "cores": cores,
        "images_per_s": round(ceiling, 1),
        "ratio_to_plugin_steady": round(ceiling / (plugin["steady_images_per_s"] or 1), 2),
        "meaning": "no writer through the same server can exceed cores / (server CPU per row) with every core busy",
    }
    return out
