"""`imgest bench read --check-fidelity`: does the DAG's read-back check report each reader's rate as a full read does?

For each size of ImageNet's count set (``imgest.sources.devdata.countscale``: 55 k, 143 k, 1.33 M images), the
dataset is ingested by the project's own command into Cassandra and into shards on S3 (each run timed: the check's
budget follows from it as in a DAG run), then ROUNDS times per target: the check as the DAG runs it (its budget,
the 10,000-image sample, every reader of the target in both modes) and a full read of the same sample by the same
readers without a budget. Per reader and mode it reports the check's steady rate against the full read's (median
of the rounds; within ``TOLERANCE``), the check's seconds against its budget, and the spread of the rate against
the window size: from each full read's batch times, the rate over the ``k`` batches after the warm-up against the
full read's steady rate, worst case over readers and rounds (``window_spread``), which is what the window
(``CHECK_WINDOW_BATCHES``) is chosen from. A ``dali_s3`` part reads one sample of the S3 shards with DALI's own
``s3://`` reader at 1 to 8 pipelines in parallel beside imgest's stream reader feeding the same DALI pipeline.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from imgest.bench.read_data import Ingest
from imgest.core import defaults
from imgest.core.paths import state_dir
from imgest.core.settings import CassandraSettings, S3Settings
from imgest.readback.check import ReadCheckOptions
from imgest.readback.measure import RunResult

log = logging.getLogger(__name__)
SIZES = {"55k": 0.0413, "143k": 0.1075, "1.33M": 1.0}  # fractions of the count set (train + val images)
TOLERANCE = 0.2  # the check's steady rate within 20 % of the full read's
WINDOWS = (1, 2, 4, 8, 16, 32)  # window sizes (batches after the warm-up) whose spread is shown
DALI_S3_READERS = (1, 2, 4, 8)


def prepare(label: str, ingest: Ingest) -> dict[str, Any]:
    """The count set's LABEL size stored in Cassandra and as shards on S3 by INGEST (cached: a size whose stores
    still hold it is not ingested again), with each run's seconds."""
    from imgest.bench.read_data import stores_hold
    from imgest.bench.scale import prepare_datasets

    fraction = SIZES[label]
    _, source, images = prepare_datasets("count", [fraction])[0]
    tag = label.replace(".", "").lower()
    root = state_dir() / "bench" / f"fidelity-{tag}"
    marker = root / "prepared.json"
    where: dict[str, Any] = {
        "label": label,
        "images": images,
        "src": str(source),
        "dataset": f"fidelity{tag}",
        "keyspace": f"bench_fidelity_{tag}",
        "s3": f"s3://imgest/bench/fidelity-{tag}",
    }
    if marker.is_file():
        known = json.loads(marker.read_text())
        if stores_hold(known):
            return known
    base = [str(source), "--layout", "cls-loc", "--work-dir", str(root / "work"), "--dataset", where["dataset"]]
    runs = {
        "cassandra": ["ingest", "cassandra", *base, "--keyspace", where["keyspace"], "--verify"],
        "shards": ["ingest", "shards", *base, "--dest", where["s3"], "--verify"],
    }
    for target, argv in runs.items():
        t0 = time.perf_counter()
        if ingest(argv) != 0:
            raise RuntimeError(f"preparing the fidelity dataset failed: imgest {' '.join(argv)}")
        where[f"{target}_run_seconds"] = round(time.perf_counter() - t0, 1)
    root.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(where, indent=1))
    return where


def _settings(where: dict[str, Any], cassandra: CassandraSettings, s3: S3Settings) -> dict[str, Any]:
    from imgest.sinks.cassandra.schema import TableLayout

    return {"cassandra": cassandra, "s3": s3, "tables": TableLayout(where["keyspace"]), "dataset": where["dataset"]}


def one_round(target: str, where: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """The DAG's check of TARGET (its budget from the run's seconds) and a full read of the same sample."""
    from imgest.readback.step import run_target

    location = where["s3"] if target == "shards" else ""
    opts = ReadCheckOptions(run_seconds=where[f"{target}_run_seconds"])
    clock = opts.clock()
    check, skipped, rs = run_target(target, location, settings, opts, clock=clock)
    check_seconds = clock.elapsed()
    full, _, _ = run_target(target, location, settings, replace(opts, seconds=0), clock=None)
    return {
        "budget_s": clock.seconds,
        "check_seconds": round(check_seconds, 1),
        "train_images": rs.sample.total if rs.sample else len(rs),
        "checked": len(rs),
        "check": check,
        "full": full,
        "skipped": skipped,
    }


def window_errors(run: RunResult, full_rate: float, warmup: int) -> dict[int, float]:
    """For each window size k: |the rate over the k batches after RUN's warm-up - FULL_RATE| / FULL_RATE."""
    ends, sizes = run.batch_ends, run.batch_images
    errors = {}
    for k in WINDOWS:
        if len(ends) < warmup + k or full_rate <= 0:
            continue
        start = ends[warmup - 1] if warmup else 0.0
        rate = sum(sizes[warmup : warmup + k]) / max(ends[warmup + k - 1] - start, 1e-9)
        errors[k] = abs(rate - full_rate) / full_rate
    return errors


def compare(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per reader and mode: the check's steady rate and the full read's (medians of the rounds), their ratio,
    whether within TOLERANCE, and the window spread over the full reads."""
    rows = []
    for i, first in enumerate(rounds[0]["check"]):
        checks = [r["check"][i] for r in rounds]
        fulls = [r["full"][i] for r in rounds]
        check_rate = statistics.median(c.steady_rate for c in checks)
        full_rate = statistics.median(f.steady_rate for f in fulls)
        spread: dict[int, float] = {}
        for f in fulls:
            for k, err in window_errors(f, f.steady_rate, f.warmup_batches).items():
                spread[k] = max(spread.get(k, 0.0), err)
        ratio = check_rate / full_rate if full_rate else 0.0
        rows.append(
            {
                "reader": first.reader,
                "mode": first.mode,
                "check_images": statistics.median(c.images for c in checks),
                "check_steady": all(c.steady for c in checks),
                "check_rate": round(check_rate, 1),
                "check_startup_s": round(statistics.median(c.startup_s for c in checks), 2),
                "check_stops": sorted({c.stop for c in checks}),
                "full_images": fulls[0].images,
                "full_rate": round(full_rate, 1),
                "full_rates": [round(f.steady_rate, 1) for f in fulls],
                "full_wall_rate": round(statistics.median(f.images_per_s for f in fulls), 1),
                "full_startup_s": round(statistics.median(f.startup_s for f in fulls), 2),
                "ratio": round(ratio, 3),
                "within": abs(ratio - 1) <= TOLERANCE,
                "window_spread": {str(k): round(v, 3) for k, v in sorted(spread.items())},
                "verified": all(r.ok for r in (*checks, *fulls)),
            }
        )
    return rows


def dali_s3(where: dict[str, Any], s3: S3Settings, sample: int, modes: Sequence[str]) -> list[dict[str, Any]]:
    """DALI's own s3:// reader at 1..8 pipelines in parallel beside imgest's stream reader feeding the same DALI
    pipeline, over one sample (whole shards) of the S3 copy, no budget."""
    from imgest.readback.check import dali_s3_env, s3_stream_run
    from imgest.readback.datasets import shards_set
    from imgest.readback.readers import run_webdataset
    from imgest.sinks.shards.store import open_store

    rs = shards_set(open_store(where["s3"], s3), sample=sample)
    bucket, _, prefix = where["s3"][5:].partition("/")
    opts = ReadCheckOptions(batch_size=defaults.CHECK_DALI_S3_BATCH)
    rows = []
    for mode in modes:
        spec = opts.spec(mode)
        for k in DALI_S3_READERS:
            with dali_s3_env(s3):
                result = run_webdataset("shards-s3-dali", rs, spec, where["s3"], readers=k)
            rows.append(_dali_row(result, k, len(rs)))
        stream = s3_stream_run(rs, s3, bucket, prefix, replace(spec, batch_size=64), replace(opts.s3, shuffle_buffer=0))
        rows.append(_dali_row(stream, 0, len(rs)))
    return rows


def _dali_row(result: RunResult, readers: int, images: int) -> dict[str, Any]:
    return {
        "reader": result.reader,
        "mode": result.mode,
        "pipelines": readers,
        "images": images,
        "steady_rate": result.steady_rate,
        "wall_rate": result.images_per_s,
        "startup_s": result.startup_s,
        "cpu_cores": result.cpu_cores,
        "verified": result.ok,
    }
