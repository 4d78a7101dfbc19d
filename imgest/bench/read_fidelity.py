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
SIZES = {"55k": 0.0413, "133k": 0.1, "143k": 0.1075, "1.33M": 1.0}  # fractions of the count set (train + val)
TOLERANCE = 0.2  # the check's steady rate within 20 % of the full read's
WINDOWS = (1, 2, 4, 8, 16, 32)  # window sizes (batches after the warm-up) whose spread is shown
TIME_WINDOWS = (0.25, 0.5, 1.0, 2.0, 4.0)  # ... and in seconds after the warm-up
DALI_S3_READERS = (1, 2, 4, 8)


def prepare(label: str, ingest: Ingest) -> dict[str, Any]:
    """The count set's LABEL size stored in Cassandra and as shards on S3: the stores `imgest bench scale --dag`
    left (with the budget their DAG runs gave their checks) where they still hold, else ingested by INGEST (cached:
    a size whose stores still hold it is not ingested again) with each run's seconds."""
    from imgest.bench.read_data import stores_hold

    reused = dag_stores(label)
    if reused is not None:
        return reused
    tag = label.replace(".", "").lower()
    root = state_dir() / "bench" / f"fidelity-{tag}"
    marker = root / "prepared.json"
    if marker.is_file():
        known = json.loads(marker.read_text())
        if stores_hold(known):
            return dict(known)
    from imgest.bench.scale import prepare_datasets

    _, source, images = prepare_datasets("count", [SIZES[label]])[0]
    dataset = f"fidelity{tag}"
    where: dict[str, Any] = {"label": label, "images": images, "src": str(source), "from": "imgest ingest"}
    where |= {"keyspace": f"bench_fidelity_{tag}", "s3": f"s3://imgest/bench/fidelity-{tag}"}
    where |= {"cassandra_dataset": dataset, "shards_dataset": dataset}
    base = [str(source), "--layout", "cls-loc", "--work-dir", str(root / "work"), "--dataset", dataset]
    runs = {
        "cassandra": ["ingest", "cassandra", *base, "--keyspace", where["keyspace"], "--verify"],
        "shards": ["ingest", "shards", *base, "--dest", where["s3"]],
    }
    for target, argv in runs.items():
        t0 = time.perf_counter()
        if ingest(argv) != 0:
            raise RuntimeError(f"preparing the fidelity dataset failed: imgest {' '.join(argv)}")
        where[f"{target}_run_seconds"] = round(time.perf_counter() - t0, 1)
    root.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(where, indent=1))
    return where


def dag_stores(label: str) -> dict[str, Any] | None:
    """The stores `imgest bench scale --dag` left at LABEL's size (dag-<pct>-cassandra, dag-<pct>-shards), where
    both still hold and both DAG runs' checks recorded their budget: the run seconds are those that give that
    budget (9 x budget: the check's share is 10 % of the run with it); None otherwise."""
    from imgest.bench.read_data import stores_hold
    from imgest.core import workdir

    pct = {"1.33M": "100pct", "133k": "10pct"}.get(label)
    if pct is None:
        return None
    checks = {t: workdir.dataset_workdir(f"dag-{pct}-{t}") / workdir.READ_REPORT for t in ("cassandra", "shards")}
    if not all(p.is_file() for p in checks.values()):
        return None
    reports = {t: json.loads(p.read_text()) for t, p in checks.items()}
    where: dict[str, Any] = {"label": label, "from": f"imgest bench scale --dag ({pct})"}
    where |= {"keyspace": f"dag_{pct}_cassandra", "s3": reports["shards"]["location"]}
    where |= {"cassandra_dataset": f"dag-{pct}-cassandra", "shards_dataset": f"dag-{pct}-shards"}
    where |= {f"{t}_run_seconds": round(9 * r["budget_s"], 1) for t, r in reports.items()}
    where["images"] = reports["shards"]["split_rows"]
    return where if stores_hold(where) else None


def _settings(where: dict[str, Any], cassandra: CassandraSettings, s3: S3Settings) -> dict[str, Any]:
    from imgest.sinks.cassandra.schema import TableLayout

    tables = TableLayout(where["keyspace"])
    return {"cassandra": cassandra, "s3": s3, "tables": tables, "dataset": where["cassandra_dataset"]}


def one_round(
    target: str,
    where: dict[str, Any],
    settings: dict[str, Any],
    full_first: bool = False,
    dali_full: bool | None = None,
) -> dict[str, Any]:
    """The DAG's check of TARGET (its budget from the run's seconds) and a full read of the same sample, the full
    read first where FULL_FIRST (the rounds alternate, so that neither always follows the other's readers: with
    the full read always second, the raw shard readers' full reads at 55 k came out 1.28-1.36 times slower than
    the check's reads of the same sample). The full read reads a sample again where one read ends before the
    reader's least window, as the check does (imgest.readback.passes); DALI's s3:// reader only where DALI_FULL
    (None: where this round's check ran it, or the full read comes first): a check that runs none has nothing to
    compare it with, and its full read takes 145 s a mode at 143 k."""
    from imgest.readback.step import run_target

    location = where["s3"] if target == "shards" else ""
    opts = ReadCheckOptions(run_seconds=where[f"{target}_run_seconds"])
    unbudgeted = replace(opts, seconds=0, settle=True)
    if full_first:
        full, _, _ = run_target(target, location, settings, replace(unbudgeted, dali_s3=dali_full is not False))
    clock = opts.clock()
    check, skipped, rs = run_target(target, location, settings, opts, clock=clock)
    check_seconds = clock.elapsed()
    if not full_first:
        dali = ran_dali_s3({"check": check}) if dali_full is None else dali_full
        full, _, _ = run_target(target, location, settings, replace(unbudgeted, dali_s3=dali))
    return {
        "full_first": full_first,
        "budget_s": clock.seconds,
        "check_seconds": round(check_seconds, 1),
        "train_images": rs.sample.total if rs.sample else len(rs),
        "checked": len(rs),
        "check": check,
        "full": full,
        "skipped": skipped,
    }


def ran_dali_s3(run: dict[str, Any]) -> bool:
    """Whether RUN's check (one_round's) read with DALI's s3:// reader."""
    return any(r.reader == "shards-s3-dali" for r in run["check"])


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


def time_window_errors(run: RunResult, full_rate: float, warmup: int) -> dict[float, float]:
    """For each window of t seconds: |the rate over the batches after RUN's warm-up that end within t seconds of
    it - FULL_RATE| / FULL_RATE (windows the read did not last are left out)."""
    ends, sizes = run.batch_ends, run.batch_images
    errors: dict[float, float] = {}
    if len(ends) <= warmup or full_rate <= 0:
        return errors
    start = ends[warmup - 1] if warmup else 0.0
    for t in TIME_WINDOWS:
        last = max((i for i in range(warmup, len(ends)) if ends[i] - start <= t), default=None)
        if last is None or ends[-1] - start < t:
            continue
        rate = sum(sizes[warmup : last + 1]) / max(ends[last] - start, 1e-9)
        errors[t] = abs(rate - full_rate) / full_rate
    return errors


def compare(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per reader and mode: the check's steady rate and the full read's (medians of the rounds), their ratio,
    whether within TOLERANCE, and the window spread over the full reads."""
    rows = []
    for first in rounds[0]["full"]:
        key = (first.reader, first.mode)
        fulls = [f for r in rounds for f in r["full"] if (f.reader, f.mode) == key]
        checks = [c for r in rounds for c in r["check"] if (c.reader, c.mode) == key]  # none where it was not run
        if len(checks) < len(rounds):  # a round's check did not run it (its budget was spent before its turn)
            checks = []
        check_rate = statistics.median(c.steady_rate for c in checks) if checks else 0.0
        full_rate = statistics.median(f.steady_rate for f in fulls)
        spread: dict[int, float] = {}
        spread_s: dict[float, float] = {}
        for f in fulls:
            for k, err in window_errors(f, f.steady_rate, f.warmup_batches).items():
                spread[k] = max(spread.get(k, 0.0), err)
            for t, err in time_window_errors(f, f.steady_rate, f.warmup_batches).items():
                spread_s[t] = max(spread_s.get(t, 0.0), err)
        ratio = check_rate / full_rate if full_rate else 0.0
        steady = bool(checks) and all(c.steady for c in checks)
        # what a user was told: the rates the check reported as throughputs, in the rounds it did (a round that
        # did not run the reader, or marked its rate not steady, reported none)
        told = [c.steady_rate for r in rounds for c in r["check"] if (c.reader, c.mode) == key and c.steady]
        told_ratio = statistics.median(told) / full_rate if told and full_rate else 0.0
        rows.append(
            {
                "reader": first.reader,
                "mode": first.mode,
                "check_images": statistics.median(c.images for c in checks) if checks else 0,
                "check_steady": steady,
                "check_rate": round(check_rate, 1),
                "check_rates": [round(c.steady_rate, 1) for c in checks],  # each round's, in order
                "check_passes": [c.passes for c in checks],  # reads of its whole sample (imgest.readback.passes)
                "check_startup_s": round(statistics.median(c.startup_s for c in checks), 2) if checks else None,
                "check_stops": sorted({c.stop for c in checks}) if checks else ["not run"],
                "full_images": fulls[0].images,
                "full_rate": round(full_rate, 1),
                "full_rates": [round(f.steady_rate, 1) for f in fulls],
                "full_passes": [f.passes for f in fulls],
                "full_wall_rate": round(statistics.median(f.images_per_s for f in fulls), 1),
                "full_startup_s": round(statistics.median(f.startup_s for f in fulls), 2),
                "ratio": round(ratio, 3),
                "within": steady and abs(ratio - 1) <= TOLERANCE,  # a rate not steady in a round is no result
                "reported_rounds": len(told),
                "reported_ratio": round(told_ratio, 3),
                "reported_within": not told or abs(told_ratio - 1) <= TOLERANCE,  # no figure told is no wrong one
                "window_spread": {str(k): round(v, 3) for k, v in sorted(spread.items())},
                "window_spread_s": {str(t): round(v, 3) for t, v in sorted(spread_s.items())},
                "verified": all(r.ok for r in (*checks, *fulls)),
            }
        )
    return rows


def dali_s3(where: dict[str, Any], s3: S3Settings, sample: int, modes: Sequence[str]) -> list[dict[str, Any]]:
    """DALI's own s3:// reader at 1..8 pipelines in parallel beside imgest's stream reader feeding the same DALI
    pipeline, over one sample (whole shards) of the S3 copy, no budget."""
    from imgest.readback.check_s3 import s3_stream_run
    from imgest.readback.dali_s3 import dali_s3_env
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
