"""`imgest bench plugin`: imgest beside cassandra-dali-plugin (crs4), the peer its users come from, on its terms.

Four comparisons, each with both sides measured in the same run on the same rows and the same server:
- **readers at 0 ms**: imgest's Cassandra reader (its defaults) and the plugin's ``fn.crs4.cassandra`` (its
  operator defaults, its example scripts' settings, its long-fat-network preset) through the same DALI pipeline,
  raw bytes and CPU decode + augment, pinned the same way (servers on one core, the reader on the other);
- **readers through a real TCP proxy** (Toxiproxy) adding 10 / 50 / 100 ms and jitter: the network sweep of
  ``imgest bench read`` with the plugin's presets among its readers, several epochs in a row;
- **writers** (imgest.bench.plugin_writers): the plugin's ``extract_spark.py`` as its README runs it (spark-submit,
  ``spark.default.parallelism=10``, ``UNCHANGED`` bytes) against ``imgest ingest cassandra`` (original bytes kept,
  its verification included), same source tree at two sizes, same Spark master;
- **readers on the three-node ring** (imgest.bench.plugin_ring), every node behind its own proxy;
- **the plugin's own benchmark**: its ``loop_read.py`` (as shipped, pointed at an imgest table and an id list in
  the format its ``cache_uuids.py`` writes) beside imgest's reader on the same rows at the same batch size.
Every run records whether the machine was quiet (imgest.bench.measure); a target is only called met on a quiet run.
"""

from __future__ import annotations

import logging
import re
import statistics
from pathlib import Path
from typing import Any

from imgest.bench.read_data import Ingest
from imgest.core.settings import CassandraSettings
from imgest.readback.datasets import ReadSet
from imgest.readback.measure import RunResult

log = logging.getLogger(__name__)
PLUGIN_PRESETS = ("defaults", "examples", "lfn")
PARTS = ("readers", "sweep", "loop-read", "writers", "ring")
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
    for row in report.get("sweep_compare", []) + report.get("ring_compare", []):
        if row["epoch"] in ("second", "all"):
            key = f"reader at {row['condition']}, {row['epoch']} epoch{'s' if row['epoch'] == 'all' else ''} >= plugin"
            out[key] = bool(row["ratio"] and row["ratio"] >= 1) and quiet
    if "writers" in report:
        w = report["writers"]
        if "imgest" in w:
            out["writer >= 2x extract_spark.py (images/s, verification included)"] = w["ratio"] >= 2 and quiet
            out["writer >= 2x extract_spark.py at the steady rate (fixed costs apart)"] = (
                w.get("steady_ratio_imgest", 0) >= 2 and quiet
            )
        if "ratio_imgest-bulk" in w:
            out["bulk writer >= 2x extract_spark.py (images/s, verification included)"] = (
                w["ratio_imgest-bulk"] >= 2 and quiet
            )
            out["bulk writer >= 2x extract_spark.py at the steady rate"] = w["steady_ratio_imgest-bulk"] >= 2 and quiet
        if "imgest-bulk" in w and "imgest" in w:
            bulk, cql = w["imgest-bulk"], w["imgest"]
            out["Cassandra CPU per row, bulk <= half of CQL's (per further row, per-job costs apart)"] = (
                bulk.get("server_cpu_ms_per_row_marginal", 1) <= cql.get("server_cpu_ms_per_row_marginal", 0) / 2
                and quiet
            )
        for side, client in (("imgest-header", "Python driver"), ("imgest-helper-header", "cql-helper, Java driver")):
            if side in w:
                out[f"CQL writer CPU per further row <= the plugin's (same check: header; {client})"] = (
                    w[side].get("client_cpu_ms_per_row_marginal", 1)
                    <= w["plugin"].get("client_cpu_ms_per_row_marginal", 0)
                    and quiet
                )
    if "loop_read" in report:
        out["imgest reader >= the plugin's loop_read.py on its own benchmark"] = (
            report["loop_read"]["ratio"] >= 1 and quiet
        )
    return out


def _services() -> tuple[CassandraSettings, Any]:
    """The single node, SeaweedFS and Toxiproxy up; a ring left running is stopped (its idle nodes would be other
    processes on the machine during every part but the ring's, which starts it again)."""
    from imgest.core.settings import S3Settings
    from imgest.services import CassandraServer, S3Server
    from imgest.services.latency import LatencyProxy
    from imgest.services.ring import CassandraRing

    if CassandraRing.default().down():
        log.info("stopped the three-node ring: it runs only during the ring part")

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
    ring_rtts: list[float] | None = None,
    writer_copies: int = 1,
    writer_sides: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Prepare the datasets (cached; stored with INGEST), then each of PARTS (readers, sweep, loop-read, writers,
    ring), the machine's quietness recorded over each."""
    from imgest.bench.machine import machine_info
    from imgest.bench.measure import QuietWatch, server_pids
    from imgest.bench.read import medians
    from imgest.bench.read_data import prepare, prepare_sweep, read_sets, sweep_sets
    from imgest.bench.read_sweep import PLUGIN, latency_sweep
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
    _loop_and_writers(
        report, parts, examples, cassandra, rs, root, Path(where["src"]), images, rounds, writer_copies, writer_sides
    )
    if "ring" in parts:
        _ring(report, Path(prepare_sweep(sweep_images, where, ingest)["src"]), root, ring_rtts, rounds, epochs)
    report["targets"] = targets(report)
    return report


def _ring(report: dict[str, Any], src: Path, root: Path, rtts: list[float] | None, rounds: int, epochs: int) -> None:
    """measure_all's ring part: the readers on the three-node ring over SRC (the sweep's images), into REPORT."""
    from imgest.bench.measure import QuietWatch, server_pids
    from imgest.bench.plugin_ring import ring_sweep, ring_up

    ring, proxy = ring_up()  # before the watch: the ring's nodes are servers measured against, not other processes
    nodes = [p for p in (n.process.pid() for n in ring.nodes) if p]
    with QuietWatch(server_pids() + nodes) as watch:
        report["ring"] = ring_sweep(
            ring, proxy, src, root / "ring-work", rtts or [0, 50], rounds, epochs, report["batch_size"]
        )
    report["quiet"]["ring"] = watch.result.to_dict()
    report["ring_compare"] = sweep_compare(report["ring"]["rows"])


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
    writer_copies: int,
    writer_sides: tuple[str, ...] = (),
) -> None:
    """measure_all's loop-read and writers parts (when in PARTS), into REPORT; WRITER_SIDES: the writers (() all)."""
    from imgest.bench.measure import QuietWatch, server_pids
    from imgest.bench.plugin_writers import SIDES, writers
    from imgest.readback.pinning import pinned

    if "loop-read" in parts:
        with QuietWatch(server_pids()) as watch, pinned(server_pids()):
            report["loop_read"] = loop_read(examples, cassandra, rs)
        report["quiet"]["loop_read"] = watch.result.to_dict()
    if "writers" in parts:
        from imgest.bench.plugin_writers import linked_copies

        # the train folder of the readers' dataset, each image under WRITER_COPIES names (hard links)
        src = linked_copies(readers_src / "train", root / f"writer-src-{images}x{writer_copies}", writer_copies)
        with QuietWatch(server_pids()) as watch:
            sides = writer_sides or SIDES
            report["writers"] = writers(examples, src, root / "writer-work", cassandra, max(1, rounds), sides)
        report["quiet"]["writers"] = watch.result.to_dict()


def main(json_out: Path, plot_out: Path | None, parts: set[str], **kw: Any) -> dict[str, Any]:
    """Measure PARTS (see measure_all; KW: its sizes and the ingest command), print the tables and targets, write
    JSON and the plot."""
    from imgest.bench.plugin_report import plot, print_report
    from imgest.core.report import write_json

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
