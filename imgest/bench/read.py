"""`imgest bench read`: DALI read throughput from Cassandra, shards (folder and S3) and files, same images.

One generated dataset is stored three ways by the project's own jobs (Cassandra tables, shards in a folder
and on S3, files); every reader then reads the same train rows through the same DALI pipeline, pinned the same
way (servers on one core, the reader on the other), raw bytes and the CPU training pipeline, median of ROUNDS.
A network sweep puts a real TCP proxy (Toxiproxy) between the readers and Cassandra / S3 and adds round trips,
then a bandwidth limit and jitter; the readers whose window sizes itself read several epochs in a row (what a
training run sees: the first epoch grows the window, later ones start from it), optionally over a larger copy of
the dataset (``--sweep-images``: the same images hard-linked under new names, stored on S3 and in Cassandra only)
so that an epoch lasts seconds, not the fraction of a second in which its start-up dominates. One methodology
throughout: a reader's images/s is its epoch rate, the harmonic mean of its batch rates (as the
cassandra-dali-plugin's paper states it), median of the rounds, with the CPU cores the reading process used per
1,000 images/s.
"""

from __future__ import annotations

import logging
import statistics
from pathlib import Path
from typing import Any

from imgest.bench.machine import machine_info
from imgest.bench.measure import QuietWatch, server_pids
from imgest.bench.read_data import Ingest, prepare, prepare_sweep, read_sets, sweep_sets
from imgest.bench.read_report import anchors, plot, print_report
from imgest.bench.read_sweep import SWEPT, Condition, kept_under_latency, latency_sweep, targets
from imgest.core.report import write_json
from imgest.core.settings import CassandraSettings, S3Settings
from imgest.readback.check import ReadCheckOptions
from imgest.readback.datasets import ReadSet
from imgest.readback.measure import RunResult

log = logging.getLogger(__name__)


def one_round(
    sets: dict[str, ReadSet],
    where: dict[str, Any],
    cassandra: CassandraSettings,
    s3: S3Settings,
    opts: ReadCheckOptions,
) -> tuple[list[RunResult], list[str]]:
    """Every reader, every mode, once; with OPTS.seconds, the DAG's check's budget over all but the PyTorch datasets
    (each reader then reads its share of it: imgest.readback.budget)."""
    from imgest.readback.check import cassandra_runs, files_runs, folder_shard_runs
    from imgest.readback.check_s3 import s3_shard_runs

    clock = opts.clock() if opts.seconds > 0 else None
    bucket, _, prefix = where["s3"][5:].partition("/")
    results = files_runs(sets["files"], opts, clock=clock)
    results += folder_shard_runs(sets["shards"], str(where["shards"]), opts, clock=clock)
    s3_results, skipped = s3_shard_runs(sets["s3"], s3, bucket, prefix, opts, clock=clock)
    results += s3_results + cassandra_runs(cassandra, sets["cassandra"], opts, clock=clock)
    try:  # the PyTorch datasets (imgest[torch]) beside webdataset's own loader
        from imgest.readback.torchcheck import torch_runs

        results += torch_runs(sets, where["s3"], cassandra, s3, opts)
    except ImportError as exc:
        skipped.append(f"torch-shards-s3, torch-cassandra: {exc}")
    return results, skipped


def medians(rounds: list[list[RunResult]]) -> list[dict[str, Any]]:
    """Per (reader, mode): the median, min and max images/s over rounds, and the median of the other figures."""
    rows = []
    for i, first in enumerate(rounds[0]):
        runs = [r[i] for r in rounds]
        ips = [r.epoch_rate for r in runs]
        rows.append(
            {
                "reader": first.reader,
                "mode": first.mode,
                "images": first.images,
                "images_per_s": statistics.median(ips),
                "min": min(ips),
                "max": max(ips),
                "wall_images_per_s": statistics.median(r.images_per_s for r in runs),
                "mb_per_s": statistics.median(r.mb_per_s for r in runs),
                "batch_ms_p50": statistics.median(r.batch_ms_p50 for r in runs),
                "batch_ms_p99": statistics.median(r.batch_ms_p99 for r in runs),
                "cpu_cores": statistics.median(r.cpu_cores for r in runs),
                "cores_per_1k": statistics.median(r.cores_per_1k for r in runs),
                "first_batch_ms": statistics.median(r.first_batch_ms for r in runs),
                "startup_s": statistics.median(r.startup_s for r in runs),  # to the first batch, build included
                "steady_rate": statistics.median(r.steady_rate for r in runs),  # after the warm-up, wall time
                "steady": all(r.steady for r in runs),
                "verified": all(r.ok for r in runs),
                "budget_cut": any(r.budget_cut for r in runs),  # --check-seconds stopped it in some round
                "problems": [p for r in runs for p in r.problems][:5],
                "settings": first.settings,
            }
        )
    return rows


def ratios(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """The figures the targets are stated in."""
    get = {(r["reader"], r["mode"]): r["images_per_s"] for r in rows}

    def ratio(a: tuple[str, str], b: tuple[str, str]) -> float | None:
        return round(get[a] / get[b], 2) if get.get(a) and get.get(b) else None

    return {
        "cassandra_raw_vs_simple (target >= 4)": ratio(("cassandra", "raw"), ("cassandra-simple", "raw")),
        "cassandra_raw_vs_files": ratio(("cassandra", "raw"), ("files", "raw")),
        "cassandra_train_vs_files_train (target >= 0.9)": ratio(("cassandra", "train"), ("files", "train")),
        "shards_folder_raw_vs_files (target >= 1.0)": ratio(("shards-folder", "raw"), ("files", "raw")),
        "shards_folder_train_vs_files": ratio(("shards-folder", "train"), ("files", "train")),
        "s3_stream_raw_vs_webdataset (target >= 1.5)": ratio(
            ("shards-s3-stream", "raw"), ("shards-s3-webdataset", "raw")
        ),
        "s3_stream_train_vs_webdataset": ratio(("shards-s3-stream", "train"), ("shards-s3-webdataset", "train")),
        "s3_dali_raw_vs_stream": ratio(("shards-s3-dali", "raw"), ("shards-s3-stream", "raw")),
    }


def measure_all(
    images: int,
    rounds: int,
    conds: list[Condition],
    depths: list[int],
    batch_size: int,
    sample: int = 0,
    sweep_only: bool = False,
    epochs: int = 3,
    sweep_images: int = 0,
    readers: tuple[str, ...] = SWEPT,
    *,
    ingest: Ingest,
    check_seconds: float = 0.0,
) -> dict[str, Any]:
    """Prepare (storing the datasets with INGEST), then every reader ROUNDS times (after a warm-up round; not with
    SWEEP_ONLY; within CHECK_SECONDS a round when above 0, as the DAG's check) and the network sweep (ROUNDS repeats
    per point, the conditions in turn within each, EPOCHS epochs per run of the adaptive readers, which read a
    dataset of SWEEP_IMAGES when larger than IMAGES), pinned."""
    from imgest.readback.pinning import pinned
    from imgest.services import CassandraServer, S3Server
    from imgest.services.latency import LatencyProxy

    services = [CassandraServer.default(), S3Server.default(), *([LatencyProxy.default()] if conds else [])]
    for service in services:
        service.up()
    cassandra, s3 = CassandraSettings.from_env(), S3Settings.from_env()
    where = prepare(images, ingest)
    sets = read_sets(where, cassandra, s3, sample)
    window_where = prepare_sweep(sweep_images, where, ingest) if conds and sweep_images > images else where
    window_sets = sweep_sets(window_where, cassandra, s3) if window_where is not where else sets
    opts = ReadCheckOptions(batch_size=batch_size, seconds=check_seconds)
    runs: list[tuple[list[RunResult], list[str]]] = []
    with QuietWatch(server_pids()) as watch, pinned(server_pids()) as pinning:
        if not sweep_only:
            one_round(sets, where, cassandra, s3, opts)  # warm-up: page cache, JIT of the servers, connections
            runs = [one_round(sets, where, cassandra, s3, opts) for _ in range(rounds)]
        sweep: list[dict[str, Any]] = []
        if conds:
            window = (window_sets, window_where, readers)
            sweep = latency_sweep(sets, where, cassandra, s3, conds, depths, batch_size, rounds, epochs, *window)
    report = _report(runs, sweep, watch.result, sample, batch_size, rounds, conds, epochs)
    return {
        **report,
        "pinning": pinning,
        "check_seconds": check_seconds,
        "images": {k: len(v) for k, v in sets.items()},
        "sweep_images": {k: len(v) for k, v in window_sets.items() if k in ("s3", "cassandra")},
    }


def _report(
    runs: list[tuple[list[RunResult], list[str]]],
    sweep: list[dict[str, Any]],
    quiet: Any,
    sample: int,
    batch_size: int,
    rounds: int,
    conds: list[Condition],
    epochs: int,
) -> dict[str, Any]:
    """The report of measure_all (its keys in their order; pinning and the image counts are filled in there)."""
    rows = medians([r for r, _ in runs]) if runs else []
    kept = kept_under_latency(sweep)
    met = targets(kept)
    if not quiet.quiet:  # a target is only met on a quiet machine
        met = {name: {**t, "met": False, "not_quiet": True} for name, t in met.items()}
    return {
        "machine": machine_info(),
        "quiet": quiet.to_dict(),
        "pinning": None,
        "method": "images/s is the epoch rate: the harmonic mean of the batch rates (each batch's images over the "
        "time its pipeline run() took), median of the rounds; cpu_cores is the reading process's CPU time over the "
        "epoch's wall time, cores_per_1k that per 1,000 images/s",
        "images": None,
        "sweep_images": None,
        "sweep_epochs": epochs,
        "sweep_note": "the adaptive readers (window 'adaptive', and fixed --depths) read sweep_images per epoch, "
        "EPOCHS epochs in a row per round (epoch 'all': the harmonic mean of a round's epoch rates, median of the "
        "rounds); the readers that request nothing ahead (cassandra-simple, shards-s3-webdataset) read `images`",
        "sample": sample,
        "batch_size": batch_size,
        "rounds": rounds,
        "readers": rows,
        "skipped": runs[0][1] if runs else [],
        "ratios": ratios(rows) if rows else {},
        "conditions": [c.__dict__ for c in conds],
        "latency_sweep": sweep,
        "latency_kept": kept,
        "targets": met,
        "anchors": anchors(sweep),
    }


def main(
    json_out: Path,
    plot_out: Path | None,
    images: int,
    rounds: int,
    conds: list[Condition],
    depths: list[int],
    batch_size: int = 64,
    sample: int = 0,
    sweep_only: bool = False,
    epochs: int = 3,
    sweep_images: int = 0,
    readers: tuple[str, ...] = SWEPT,
    *,
    ingest: Ingest,
    check_seconds: float = 0.0,
) -> dict[str, Any]:
    """Measure (storing the datasets with INGEST), print the tables, the target ratios and the anchors, write JSON
    (and the plot)."""
    report = measure_all(
        images,
        rounds,
        conds,
        depths,
        batch_size,
        sample,
        sweep_only,
        epochs,
        sweep_images,
        readers,
        ingest=ingest,
        check_seconds=check_seconds,
    )
    print_report(report)
    write_json(json_out, report)
    if plot_out:
        plot(plot_out, report["readers"], report["latency_sweep"])
    return report
