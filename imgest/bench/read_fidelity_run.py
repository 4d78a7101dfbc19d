"""The check-fidelity benchmark's run, its printed tables, JSON and plot (imgest.bench.read_fidelity measures)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from imgest.bench.read_data import Ingest
from imgest.bench.read_fidelity import (
    TIME_WINDOWS,
    TOLERANCE,
    WINDOWS,
    compare,
    dali_s3,
    one_round,
    prepare,
    ran_dali_s3,
)
from imgest.core import defaults
from imgest.core.report import format_table, write_json

log = logging.getLogger(__name__)
TARGETS = ("cassandra", "shards")
COLUMNS = [
    ("size", "size"),
    ("target", "target"),
    ("reader", "reader"),
    ("mode", "mode"),
    ("check_images", "check imgs"),
    ("check_rate", "check img/s"),
    ("full_rate", "full img/s"),
    ("ratio", "ratio"),
    ("within", "<=20%"),
    ("check_startup_s", "startup s"),
    ("full_wall_rate", "full wall img/s"),
]
DALI_COLUMNS = [
    ("reader", "reader"),
    ("mode", "mode"),
    ("pipelines", "pipelines"),
    ("images", "images"),
    ("steady_rate", "steady img/s"),
    ("wall_rate", "wall img/s"),
    ("startup_s", "startup s"),
    ("cpu_cores", "cores"),
]


def measure(
    labels: Sequence[str], rounds: int, ingest: Ingest, dali_sample: int, targets: Sequence[str] = TARGETS
) -> dict[str, Any]:
    """Every size of LABELS, ROUNDS rounds per target of TARGETS, then the DALI s3:// part over DALI_SAMPLE images of
    the first size's S3 copy; the machine's quietness recorded over the reads (not the ingests)."""
    from imgest.bench.machine import machine_info
    from imgest.bench.measure import QuietWatch, server_pids
    from imgest.bench.plugin_writers import settle
    from imgest.bench.read_fidelity import _settings
    from imgest.core.settings import CassandraSettings, S3Settings
    from imgest.services import CassandraServer, S3Server

    for service in (CassandraServer.default(), S3Server.default()):
        service.up()
    cassandra, s3 = CassandraSettings.from_env(), S3Settings.from_env()
    stored = [prepare(label, ingest) for label in labels]
    sizes: list[dict[str, Any]] = []
    with QuietWatch(server_pids()) as watch:
        for where in stored:
            settings = _settings(where, cassandra, s3)
            for target in targets:
                # a node still merging what an ingest wrote would put its compactions into both sides of the
                # comparison (in the run of 2026-12-06 none was running: settled_s 3.1-3.2, the least wait)
                settled = settle(cassandra) if target == "cassandra" else 0.0
                # not counted: warms the servers (a JVM just started: its JIT), and says whether the check runs
                # DALI's s3:// reader at this size (the full reads read it only then)
                warm = one_round(target, where, settings)
                dali = ran_dali_s3(warm)
                runs = [one_round(target, where, settings, k % 2 == 1, dali) for k in range(rounds)]
                sizes.append(_size_row(where, target, runs) | {"settled_s": settled})
        dali = dali_s3(stored[0], s3, dali_sample, ("raw", "train")) if dali_sample else []
    return {
        "machine": machine_info(),
        "quiet": watch.result.to_dict(),
        "method": "per size and target, after the Cassandra node ran no compaction for 3 s (settled_s: the wait) "
        "and one round not counted (it warms the servers), ROUNDS times: the DAG's "
        "check (budget from the ingest run's seconds, 10,000-image sample, every reader in both modes), then a full "
        "read of the same sample by the same readers without a budget (a reader whose read of it ends before its "
        "least window reads it again, at most 4 times, as the check does; DALI's s3:// reader only where the "
        "uncounted round's check ran it); rates are steady rates (images after the "
        "warm-up batches over their wall time, verification included), medians of the rounds; window_spread: per "
        "window size k, the worst |rate over the k batches after the warm-up - the full read's steady rate| / that "
        "rate over the full reads",
        "tolerance": TOLERANCE,
        "warmup_batches": defaults.CHECK_WARMUP_BATCHES,
        "window_batches": defaults.CHECK_WINDOW_BATCHES,
        "rounds": rounds,
        "sizes": sizes,
        "window_spread": _spread(sizes),
        "window_spread_s": _spread(sizes, "window_spread_s", TIME_WINDOWS),
        "window_seconds": defaults.CHECK_WINDOW_SECONDS,
        "dali_s3": dali,
    }


def _size_row(where: dict[str, Any], target: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    budget = runs[0]["budget_s"]
    return {
        "size": where["label"],
        "images": where["images"],
        "target": target,
        "run_seconds": where[f"{target}_run_seconds"],
        "train_images": runs[0]["train_images"],
        "checked": runs[0]["checked"],
        "budget_s": budget,
        "check_seconds": [r["check_seconds"] for r in runs],
        "within_budget": all(r["check_seconds"] <= budget for r in runs),
        "readers": compare(runs),
        "skipped": sorted({s for r in runs for s in r["skipped"]}),
    }


def _spread(
    sizes: list[dict[str, Any]], key: str = "window_spread", windows: Sequence[float] = WINDOWS
) -> dict[str, float]:
    """Per window size: the worst error over every reader, mode, size and round."""
    worst: dict[str, float] = {}
    for size in sizes:
        for row in size["readers"]:
            for k, err in row[key].items():
                worst[k] = max(worst.get(k, 0.0), err)
    return {str(k): worst[str(k)] for k in windows if str(k) in worst}


def print_report(report: dict[str, Any]) -> None:
    rows = [{"size": s["size"], "target": s["target"], **r} for s in report["sizes"] for r in s["readers"]]
    print(format_table(rows, COLUMNS))
    for s in report["sizes"]:
        print(
            f"{s['size']} {s['target']}: run {s['run_seconds']} s, budget {s['budget_s']} s, check took "
            f"{s['check_seconds']} s ({'within' if s['within_budget'] else 'OVER'} its budget), "
            f"{s['checked']} of {s['train_images']} train images sampled"
            + (f", after {s['settled_s']} s waiting for the node's compactions" if s.get("settled_s") else "")
        )
        told = [r for r in s["readers"] if r["reported_rounds"]]
        wrong = [f"{r['reader']}/{r['mode']} {r['reported_ratio']}" for r in told if not r["reported_within"]]
        print(
            f"  rates it reported: {len(told)} of {len(s['readers'])} reader-modes, "
            f"{len(told) - len(wrong)} within 20 % of the full read" + (f" (not: {', '.join(wrong)})" if wrong else "")
        )
    print("window spread (worst error of the rate over k batches after the warm-up):", report["window_spread"])
    print("window spread over t seconds after the warm-up:", report["window_spread_s"])
    if report["dali_s3"]:
        print(format_table(report["dali_s3"], DALI_COLUMNS))
    quiet = report["quiet"]
    print(f"machine: load {quiet.get('load_start')} at the start, other processes {quiet.get('other_cores')} cores")


def plot(path: Path, report: dict[str, Any]) -> None:
    """Left: the check's steady rate over the full read's per size, reader and mode (1 = equal; the band is the
    tolerance), each bar labelled with both absolute rates. Right: per reader and mode, the worst error of the rate
    over the first t seconds after the warm-up against the full read's, over every size and round."""
    from imgest.core.report import pyplot, save_figure

    fig, (left, right) = pyplot().subplots(1, 2, figsize=(15, 5.5), gridspec_kw={"width_ratios": [3, 2]})
    rows = [(s["size"], r) for s in report["sizes"] for r in s["readers"]]
    colors = ["tab:blue" if r["within"] else "tab:red" for _, r in rows]
    bars = left.bar(range(len(rows)), [r["ratio"] for _, r in rows], color=colors)
    for bar, (_, r) in zip(bars, rows, strict=True):
        x = bar.get_x() + bar.get_width() / 2
        if not r["check_steady"]:  # the check gave it no rate: say so where its bar would be
            why = "not run" if r["check_stops"] == ["not run"] else "not steady"
            if r.get("reported_rounds"):  # a rate in some rounds, not in every one: no result, and it says so
                why = f"a rate in {r['reported_rounds']} round(s) only"
            left.annotate(f"{why}\nfull {r['full_rate']:,.0f}", (x, 0.02), ha="center", fontsize=5, rotation=90)
            continue
        text = f"{r['check_rate']:,.0f}\n{r['full_rate']:,.0f}"
        left.annotate(text, (x, bar.get_height()), ha="center", fontsize=5)
    left.axhspan(1 - TOLERANCE, 1 + TOLERANCE, color="tab:green", alpha=0.15)
    left.axhline(1.0, color="black", linewidth=0.8)
    labels = [f"{size} {r['reader']}/{r['mode']}" for size, r in rows]
    left.set_xticks(range(len(labels)), labels, rotation=90, fontsize=6)
    left.set_ylabel("check's steady rate / full read's")
    left.set_title("The DAG's check against a full read (band: within 20 %; labels: check / full img/s)", fontsize=9)
    worst: dict[str, dict[float, float]] = {}
    for _, r in rows:
        line = worst.setdefault(f"{r['reader']}/{r['mode']}", {})
        for t, err in r["window_spread_s"].items():
            line[float(t)] = max(line.get(float(t), 0.0), err)
    for name, line in worst.items():
        ts = sorted(line)
        right.plot(ts, [line[t] * 100 for t in ts], marker="o", label=name, linewidth=1)
    right.axvline(report["window_seconds"], color="tab:green", linestyle="--", label="window (s)")
    right.axhline(TOLERANCE * 100, color="tab:red", linestyle=":", label="tolerance")
    right.set_xscale("log", base=2)
    right.set_xlabel("window (seconds after the warm-up)")
    right.set_ylabel("worst error against the full read, % (clipped at 300)")
    right.set_ylim(0, min(300, right.get_ylim()[1]))  # a DALI start-up at 0.25 s (83x) hid every other line
    right.set_title("Spread of the rate against the window (worst over sizes and rounds)", fontsize=9)
    right.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    save_figure(fig, path)


def main(
    json_out: Path,
    plot_out: Path | None,
    labels: Sequence[str],
    rounds: int,
    ingest: Ingest,
    dali_sample: int,
    targets: Sequence[str] = TARGETS,
) -> dict[str, Any]:
    report = measure(labels, rounds, ingest, dali_sample, targets)
    write_json(json_out, report)
    print_report(report)
    if plot_out:
        plot(plot_out, report)
    return report
