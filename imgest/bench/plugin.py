"""`imgest bench plugin`: imgest beside cassandra-dali-plugin (crs4), the peer its users come from, on its terms.

Four comparisons, each with both sides measured in the same run on the same rows and the same server:
- **readers at 0 ms**: imgest's Cassandra reader (its defaults) and the plugin's ``fn.crs4.cassandra`` (its
  operator defaults, its example scripts' settings, its long-fat-network preset) through the same DALI pipeline,
  raw bytes and CPU decode + augment, pinned the same way (servers on one core, the reader on the other);
- **readers through a real TCP proxy** (Toxiproxy) adding 10 / 50 / 100 ms and jitter: the network sweep of
  ``imgest bench read`` with the plugin's presets among its readers, several epochs in a row;
- **writers**: the plugin's ``extract_spark.py`` as its README runs it (spark-submit, ``spark.default.parallelism=10``,
  ``UNCHANGED`` bytes) against ``imgest ingest cassandra`` (original bytes kept, its verification included), same
  source tree, same Spark master;
- **the plugin's own benchmark**: its ``loop_read.py`` (as shipped, pointed at an imgest table and an id list in
  the format its ``cache_uuids.py`` writes) beside imgest's reader on the same rows at the same batch size.
Every run records whether the machine was quiet (imgest.bench.quiet); a target is only called met on a quiet run.
"""

from __future__ import annotations

import logging
import re
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from imgest.bench.read_data import Ingest
from imgest.core.settings import CassandraSettings
from imgest.readback.datasets import ReadSet
from imgest.readback.measure import RunResult

log = logging.getLogger(__name__)
PLUGIN_PRESETS = ("defaults", "examples", "lfn")
PARTS = ("readers", "sweep", "loop-read", "writers")
WRITER_KEYSPACE = "bench_plugin_writer"


def reader_round(settings: CassandraSettings, rs: ReadSet, batch_size: int, modes: tuple[str, ...]) -> list[RunResult]:
    """Every reader once per mode at 0 ms: two epochs in a row (one pipeline or reader), the second reported."""
    from imgest.peers.crs4_reader import PRESETS, crs4_epochs
    from imgest.readback.cassandra import CassandraReadOptions
    from imgest.readback.check import cassandra_epochs
    from imgest.readback.pipelines import PipelineSpec

    out = []
    for mode in modes:
        spec = PipelineSpec(batch_size, mode=mode, verify_after=True)
        out.append(cassandra_epochs(settings, rs, spec, CassandraReadOptions(), 2)[-1])
        for name in PLUGIN_PRESETS:
            out.append(crs4_epochs(settings, rs, spec, PRESETS[name], 2)[-1])
    return out


def count_rows(settings: CassandraSettings, table: str) -> int:
    """Rows of TABLE, by a token-range scan of the ids (``SELECT count(*)`` reads every blob on one coordinator:
    a 1 GB-heap node runs out of memory on a few hundred MB of images)."""
    from imgest.sinks.cassandra.client import cassandra_session
    from imgest.sinks.cassandra.scan import scan_columns

    with cassandra_session(settings) as session:
        return sum(batch.num_rows for batch in scan_columns(session, table, ["id"]))


def plugin_writer(examples: Path, src: Path, settings: CassandraSettings, keyspace: str) -> dict[str, Any]:
    """The plugin's extract_spark.py as its README runs it, into fresh tables of KEYSPACE; wall time and rows."""
    from imgest.peers.crs4_scripts import plugin_tables_cql
    from imgest.sinks.cassandra.client import cassandra_session
    from imgest.spark.conf import submit_env

    with cassandra_session(settings) as session:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
        for statement in plugin_tables_cql(examples, keyspace):
            session.execute(statement, timeout=60)
    folder = examples / "imagenette"
    cmd = ["spark-submit", "--master", "local[2]", "--conf", "spark.default.parallelism=10"]
    cmd += ["--py-files", "extract_common.py", "extract_spark.py", str(src), "--split-subdir=train"]
    cmd += ["--data-table", f"{keyspace}.data_train", "--metadata-table", f"{keyspace}.metadata_train"]
    t0 = time.perf_counter()
    run = subprocess.run(cmd, cwd=folder, env=submit_env("local[2]"), capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if run.returncode != 0:
        raise RuntimeError(f"the plugin's extract_spark.py failed ({run.returncode}): {run.stderr[-2000:]}")
    rows = count_rows(settings, f"{keyspace}.data_train")
    return {"writer": "crs4 extract_spark.py (UNCHANGED, parallelism 10)", "seconds": round(wall, 2), "rows": rows}


def imgest_writer(src: Path, work: Path, settings: CassandraSettings, keyspace: str, ingest: Ingest) -> dict[str, Any]:
    """`imgest ingest cassandra --mode unchanged --verify` of SRC into fresh tables, run by INGEST; wall time
    (scan, job and verification) and rows."""
    from imgest.sinks.cassandra.client import cassandra_session

    with cassandra_session(settings) as session:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
    shutil.rmtree(work, ignore_errors=True)
    argv = ["ingest", "cassandra", str(src), "--work-dir", str(work), "--dataset", "writer", "--keyspace", keyspace]
    argv += ["--master", "local[2]", "--mode", "unchanged", "--verify", "--port", str(settings.port)]
    t0 = time.perf_counter()
    if ingest(argv) != 0:
        raise RuntimeError(f"imgest {' '.join(argv)} failed")
    wall = time.perf_counter() - t0
    rows = count_rows(settings, f"{keyspace}.data")
    return {"writer": "imgest ingest cassandra --mode unchanged --verify", "seconds": round(wall, 2), "rows": rows}


def _with_cpu(run: Any, server_pid: int | None) -> dict[str, Any]:
    """RUN() (a writer returning its record) with the CPU per row of the server and of the writer's process tree."""
    import os

    from imgest.bench.quiet import TreeSampler, tree_seconds

    server0 = tree_seconds([server_pid]) if server_pid else 0.0
    with TreeSampler([os.getpid()]) as tree:
        out = run()
    server = (tree_seconds([server_pid]) - server0) if server_pid else 0.0
    rows = max(1, out["rows"])
    return {
        **out,
        "server_cpu_ms_per_row": round(server / rows * 1000, 3),
        "client_cpu_ms_per_row": round(tree.seconds() / rows * 1000, 3),
    }


def writers(
    examples: Path, src: Path, work: Path, settings: CassandraSettings, rounds: int, ingest: Ingest
) -> dict[str, Any]:
    """Both writers ROUNDS times, alternating (imgest's run by INGEST); medians, images/s, CPU per row of the
    server and of each writer's processes, and the ratio (target imgest >= 2x)."""
    from imgest.services import CassandraServer

    server = CassandraServer.default().process.pid()
    runs: dict[str, list[dict[str, Any]]] = {"plugin": [], "imgest": []}
    for _ in range(rounds):
        runs["plugin"].append(
            _with_cpu(lambda: plugin_writer(examples, src, settings, WRITER_KEYSPACE + "_crs4"), server)
        )
        runs["imgest"].append(
            _with_cpu(lambda: imgest_writer(src, work, settings, WRITER_KEYSPACE + "_imgest", ingest), server)
        )
    out: dict[str, Any] = {}
    for side, results in runs.items():
        seconds = statistics.median(r["seconds"] for r in results)
        rows = results[0]["rows"]
        out[side] = {**results[0], "seconds": seconds, "all_seconds": [r["seconds"] for r in results]}
        out[side]["images_per_s"] = round(rows / seconds, 1)
        for key in ("server_cpu_ms_per_row", "client_cpu_ms_per_row"):
            out[side][key] = statistics.median(r[key] for r in results)
    out["ratio"] = round(out["imgest"]["images_per_s"] / out["plugin"]["images_per_s"], 2)
    return out


SPEED = re.compile(r"Average speed: ([0-9.]+) ± ([0-9.]+) it/s")


def write_rows_file(path: Path, rs: ReadSet) -> None:
    """The id list the plugin's loop_read.py reads (what its cache_uuids.py writes: a pickle whose ``row_keys`` is a
    list of uuid.UUID), holding RS's rows."""
    import pickle
    import uuid

    with open(path, "wb") as f:
        pickle.dump({"row_keys": [uuid.UUID(i) for i in rs.id_list()], "config": {}, "split": None}, f)


def loop_read(examples: Path, settings: CassandraSettings, rs: ReadSet) -> dict[str, Any]:
    """The plugin's own benchmark: loop_read.py as shipped (batch 128, 10 epochs, the mean of epochs 2-10), on an
    imgest table and id list; imgest's reader on the same rows, batch and epochs, averaged the same way."""
    from imgest.peers.crs4_scripts import run_example
    from imgest.readback.cassandra import CassandraReadOptions
    from imgest.readback.check import cassandra_epochs
    from imgest.readback.pipelines import PipelineSpec

    rows = examples / "imagenette" / "imgest.rows"
    write_rows_file(rows, rs)
    run = run_example(examples, "imagenette", "loop_read.py", ["--data-table", rs.table, "--rows-fn", str(rows)])
    found = SPEED.search(run.stdout)
    if run.returncode != 0 or not found:
        raise RuntimeError(f"the plugin's loop_read.py failed ({run.returncode}): {run.stderr[-2000:]}")
    theirs = float(found.group(1)) * 128  # batches/s over its epochs 2-10 (the last batch padded)
    spec = PipelineSpec(128, mode="raw", verify_after=True)
    ours_runs = cassandra_epochs(settings, rs, spec, CassandraReadOptions(), 10)
    ours = statistics.mean(r.images / r.seconds for r in ours_runs[1:])  # images over wall time, as tqdm counts
    return {
        "plugin_loop_read": {"images_per_s": round(theirs, 1), "printed": found.group(0), "batch": 128, "epochs": 10},
        "imgest_reader": {
            "images_per_s": round(ours, 1),
            "batch": 128,
            "epochs": 10,
            "verified": all(r.ok for r in ours_runs),
        },
        "rows": len(rs),
        "ratio": round(ours / theirs, 2),
        "note": "both read the version's train rows of the imgest table in batches of 128 for 10 epochs; the figure "
        "is the mean over epochs 2-10 of the epoch's rate (loop_read.py: tqdm's batches/s x 128; imgest: images "
        "over the epoch's wall time, every sample verified after the epoch)",
    }


def sweep_compare(sweep: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per condition and epoch: imgest's reader (adaptive window) beside the plugin's best preset, images/s and CPU
    cores per 1,000 images/s."""
    out = []
    keys = dict.fromkeys((s["condition"], s["epoch"]) for s in sweep if s["reader"] == "cassandra")
    for cond, epoch in keys:
        ours = next(s for s in sweep if (s["reader"], s["condition"], s["epoch"]) == ("cassandra", cond, epoch))
        theirs = [s for s in sweep if s["reader"].startswith("crs4-plugin") and s["condition"] == cond]
        theirs = [s for s in theirs if s["epoch"] == epoch or (epoch != "all" and s["epoch"] == "first")]
        if not theirs:
            continue
        best = max(theirs, key=lambda s: s["images_per_s"])
        out.append(
            {
                "condition": cond,
                "epoch": epoch,
                "imgest_images_per_s": ours["images_per_s"],
                "plugin_best": best["reader"],
                "plugin_images_per_s": best["images_per_s"],
                "ratio": round(ours["images_per_s"] / best["images_per_s"], 2) if best["images_per_s"] else None,
                "imgest_cores_per_1k": ours.get("cores_per_1k"),
                "plugin_cores_per_1k": best.get("cores_per_1k"),
            }
        )
    return out


def targets(report: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, each met or not; none is met on a run that was not quiet."""
    quiet = all(q["quiet"] for q in report["quiet"].values())
    out: dict[str, Any] = {}
    for mode in ("raw", "train"):
        rows = [r for r in report.get("readers", []) if r["mode"] == mode]
        ours = next((r for r in rows if r["reader"] == "cassandra"), None)
        theirs = [r for r in rows if r["reader"].startswith("crs4-plugin")]
        if ours and theirs:
            best = max(theirs, key=lambda r: r["images_per_s"])
            fastest = ours["images_per_s"] >= best["images_per_s"]
            leaner = ours["cores_per_1k"] <= min(r["cores_per_1k"] for r in theirs)
            out[f"reader {mode} at 0 ms >= the plugin's best preset ({best['reader']})"] = fastest and quiet
            out[f"reader {mode} at 0 ms: CPU per image <= every plugin preset"] = leaner and quiet
    for row in report.get("sweep_compare", []):
        if row["epoch"] in ("second", "all"):
            key = f"reader at {row['condition']}, {row['epoch']} epoch{'s' if row['epoch'] == 'all' else ''} >= plugin"
            out[key] = bool(row["ratio"] and row["ratio"] >= 1) and quiet
    if "writers" in report:
        out["writer >= 2x extract_spark.py (images/s, verification included)"] = (
            report["writers"]["ratio"] >= 2 and quiet
        )
    if "loop_read" in report:
        out["imgest reader >= the plugin's loop_read.py on its own benchmark"] = (
            report["loop_read"]["ratio"] >= 1 and quiet
        )
    return out


def _services() -> tuple[CassandraSettings, Any]:
    from imgest.core.settings import S3Settings
    from imgest.services import CassandraServer, S3Server
    from imgest.services.latency import LatencyProxy

    for service in (CassandraServer.default(), S3Server.default(), LatencyProxy.default()):
        service.up()
    return CassandraSettings.from_env(), S3Settings.from_env()


def measure_all(
    images: int,
    sweep_images: int,
    rounds: int,
    epochs: int,
    conds: list[Any],
    batch_size: int,
    parts: set[str],
    *,
    ingest: Ingest,
) -> dict[str, Any]:
    """Prepare the datasets (cached; stored with INGEST), then each of PARTS (readers, sweep, loop-read, writers),
    the machine's quietness recorded over each."""
    from imgest.bench.quiet import QuietWatch
    from imgest.bench.read import medians, server_pids
    from imgest.bench.read_data import prepare, prepare_sweep, read_sets, sweep_sets
    from imgest.bench.read_sweep import PLUGIN, latency_sweep
    from imgest.bench.report import machine_info
    from imgest.core.paths import state_dir
    from imgest.peers.crs4_scripts import prepare_examples
    from imgest.readback.pinning import pinned

    cassandra, s3 = _services()
    where = prepare(images, ingest)
    sets = read_sets(where, cassandra, s3)
    root = state_dir() / "bench" / "plugin"
    examples = prepare_examples(root, cassandra)
    report: dict[str, Any] = {"machine": machine_info(), "batch_size": batch_size, "rounds": rounds, "quiet": {}}
    report["images"] = len(sets["cassandra"])
    rs = sets["cassandra"]
    if "readers" in parts:
        with QuietWatch(server_pids()) as watch, pinned(server_pids()) as pin:
            reader_round(cassandra, rs, batch_size, ("raw",))  # warm-up: page cache, JIT of the server
            report["readers"] = medians(
                [reader_round(cassandra, rs, batch_size, ("raw", "train")) for _ in range(rounds)]
            )
        report["quiet"]["readers"], report["pinning"] = watch.result.to_dict(), pin
    if "sweep" in parts and conds:
        big = prepare_sweep(sweep_images, where, ingest) if sweep_images > images else where
        big_sets = sweep_sets(big, cassandra, s3) if big is not where else sets
        with QuietWatch(server_pids()) as watch, pinned(server_pids()):
            sweep = latency_sweep(
                sets, where, cassandra, s3, conds, [], batch_size, rounds, epochs, big_sets, big, ("cassandra", *PLUGIN)
            )
        report["quiet"]["sweep"] = watch.result.to_dict()
        report["sweep_images"] = len(big_sets["cassandra"])
        report["conditions"] = [c.__dict__ for c in conds]
        report["latency_sweep"], report["sweep_compare"] = sweep, sweep_compare(sweep)
    _loop_and_writers(report, parts, examples, cassandra, rs, root, Path(where["src"]), images, rounds, ingest)
    report["targets"] = targets(report)
    return report


def _loop_and_writers(
    report: dict[str, Any],
    parts: set[str],
    examples: Path,
    cassandra: CassandraSettings,
    rs: ReadSet,
    root: Path,
    readers_src: Path,
    images: int,
    rounds: int,
    ingest: Ingest,
) -> None:
    """measure_all's loop-read and writers parts (when in PARTS), into REPORT."""
    from imgest.bench.quiet import QuietWatch
    from imgest.bench.read import server_pids
    from imgest.readback.pinning import pinned

    if "loop-read" in parts:
        with QuietWatch(server_pids()) as watch, pinned(server_pids()):
            report["loop_read"] = loop_read(examples, cassandra, rs)
        report["quiet"]["loop_read"] = watch.result.to_dict()
    if "writers" in parts:
        src = root / f"writer-src-{images}"  # the train folder of the readers' dataset, hard-linked
        if not (src / "train").is_dir():
            src.mkdir(parents=True, exist_ok=True)
            subprocess.run(["cp", "-al", str(readers_src / "train"), str(src / "train")], check=True)
        with QuietWatch(server_pids()) as watch:
            report["writers"] = writers(examples, src, root / "writer-work", cassandra, max(1, rounds), ingest)
        report["quiet"]["writers"] = watch.result.to_dict()


def main(json_out: Path, plot_out: Path | None, parts: set[str], **kw: Any) -> dict[str, Any]:
    """Measure PARTS (see measure_all; KW: its sizes and the ingest command), print the tables and targets, write
    JSON and the plot."""
    from imgest.bench.plugin_report import plot, print_report
    from imgest.bench.report import write_json

    report = measure_all(parts=parts, **kw)
    if json_out.is_file() and parts != set(PARTS):  # a run of some parts updates those parts of the report
        import json

        kept = json.loads(json_out.read_text())
        for key, value in report.items():
            if key == "quiet":
                kept.setdefault("quiet", {}).update(value)
            elif key != "targets":
                kept[key] = value
        report = {**kept, "targets": targets(kept)}
    print_report(report)
    write_json(json_out, report)
    if plot_out:
        plot(plot_out, report)
    return report
