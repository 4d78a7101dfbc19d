"""`imgest bench read`'s report: the tables it prints, the published figures beside ours, the plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from imgest.bench.measure import Quietness
from imgest.bench.read_sweep import kept_under_latency
from imgest.core.report import describe_machine, format_table, pyplot, save_figure

# Published figures the report states beside ours (see docs/readback.md#benchmarks).
ANCHORS = {
    "cassandra-dali-plugin": "more than 20,000 images/s (about 20 Gb/s) with 100 ms added round trip over 25 GbE, "
    "ImageNet, one Python process, 16 prefetch buffers, 8 I/O threads, out-of-order",
    "DALI issue 5551": "5,000 images/s with fn.readers.file and 20,000 with TFRecord, from NVMe",
    "LitData": "5,800-6,700 images/s streaming ImageNet from S3",
}


def anchors(sweep: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each published figure beside the comparable one of this run."""

    def at(reader: str, cond: str) -> float | None:
        return next(
            (
                s["images_per_s"]
                for s in sweep
                if s["reader"] == reader
                and s["condition"] == cond
                and s["window"] in ("adaptive", None)
                and s["epoch"] == "second"
            ),
            None,
        )

    return [
        {
            "anchor": "cassandra-dali-plugin",
            "theirs": ANCHORS["cassandra-dali-plugin"],
            "ours": f"cassandra (default window, second epoch) at 100 ms: {at('cassandra', '100 ms')} images/s "
            "from one process on 2 shared cores, loopback through Toxiproxy",
        },
        {
            "anchor": "DALI issue 5551",
            "theirs": ANCHORS["DALI issue 5551"],
            "ours": "files / shards-folder: see the readers table of `imgest bench read` (docs/bench/read-run2.json)",
        },
        {
            "anchor": "LitData",
            "theirs": ANCHORS["LitData"],
            "ours": "shards-s3-stream (default window, second epoch) at 0 ms: "
            f"{at('shards-s3-stream', '0 ms')} images/s, at 50 ms: {at('shards-s3-stream', '50 ms')}",
        },
    ]


def plot(path: Path, rows: list[dict[str, Any]], sweep: list[dict[str, Any]]) -> None:
    """Readers side by side (raw and train, when measured); images/s of each reader per network condition and
    the share of its 0 ms rate it keeps (when swept)."""
    plt = pyplot()

    panels = (1 if rows else 0) + (2 if sweep else 0)
    fig, axes = plt.subplots(1, panels, figsize=(7 * panels, 5), squeeze=False)
    axes = list(axes[0])
    if rows:
        _plot_readers(axes.pop(0), rows)
    if sweep:
        _plot_sweep(axes[0], axes[1], sweep)
    save_figure(fig, path)


def _plot_readers(ax: Any, rows: list[dict[str, Any]]) -> None:
    readers = list(dict.fromkeys(r["reader"] for r in rows))
    for k, mode in enumerate(("raw", "train")):
        values = [next((r["images_per_s"] for r in rows if r["reader"] == n and r["mode"] == mode), 0) for n in readers]
        bars = ax.bar([i + k * 0.4 for i in range(len(readers))], values, 0.4, label=mode)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks([i + 0.2 for i in range(len(readers))], readers, rotation=30, ha="right")
    ax.set_ylabel("images/s (harmonic mean of batch rates, median)")
    ax.set_title("DALI read throughput, same images")
    ax.legend(title="pipeline")


def _plot_sweep(left: Any, right: Any, sweep: list[dict[str, Any]]) -> None:
    conds = list(dict.fromkeys(s["condition"] for s in sweep))
    lines = list(dict.fromkeys((s["reader"], s["window"], s["epoch"]) for s in sweep))
    kept = {(k["reader"], k["window"], k["epoch"], k["condition"]): k["vs_0ms"] for k in kept_under_latency(sweep)}
    width = 0.8 / max(1, len(lines))
    for j, (reader, window, epoch) in enumerate(lines):
        label = reader if window is None else f"{reader}, {'fixed ' if window != 'adaptive' else ''}{window} window"
        label += (", all epochs" if epoch == "all" else f", {epoch} epoch") if window == "adaptive" else ""
        pts = [
            next(
                (
                    s["images_per_s"]
                    for s in sweep
                    if (s["reader"], s["window"], s["epoch"], s["condition"]) == (reader, window, epoch, c)
                ),
                0,
            )
            for c in conds
        ]
        left.plot(range(len(conds)), pts, marker="o", label=label)
        ratios_ = [kept.get((reader, window, epoch, c)) or 0 for c in conds]
        right.bar([i + j * width for i in range(len(conds))], ratios_, width, label=label)
    left.set_xticks(range(len(conds)), conds, rotation=20, ha="right")
    left.set_ylabel("images/s, raw bytes (epoch rate, median of rounds)")
    left.set_title("Readers through Toxiproxy: " + ", ".join(conds[1:] if len(conds) > 1 else conds))
    left.set_ylim(bottom=0)  # from zero: a loss of a few percent looks like one
    left.legend(fontsize=7, loc="lower left")
    right.set_xticks([i + 0.4 - width / 2 for i in range(len(conds))], conds, rotation=20, ha="right")
    for goal in (0.85, 0.75):
        right.axhline(goal, color="grey", linestyle=":", linewidth=1)
    right.set_ylabel("share of the reader's 0 ms rate")
    right.set_title("Kept under latency (targets 0.85 at 50 ms, 0.75 at 100 ms)")
    right.legend(fontsize=7, loc="lower left")


READER_COLUMNS = [
    ("reader", "reader"),
    ("mode", "mode"),
    ("images_per_s", "img/s"),
    ("min", "min"),
    ("max", "max"),
    ("steady_rate", "steady img/s"),
    ("startup_s", "startup s"),
    ("mb_per_s", "MB/s"),
    ("batch_ms_p50", "p50 ms"),
    ("batch_ms_p99", "p99 ms"),
    ("cpu_cores", "cpu"),
    ("cores_per_1k", "cpu/1k img/s"),
    ("verified", "verified"),
]
SWEEP_COLUMNS = [
    ("condition", "condition"),
    ("reader", "reader"),
    ("window", "window"),
    ("epoch", "epoch"),
    ("images", "images"),
    ("images_per_s", "img/s"),
    ("steady_images_per_s", "2nd half"),
    ("first_batch_ms", "1st batch ms"),
    ("min", "min"),
    ("max", "max"),
    ("cpu_cores", "cpu"),
    ("cores_per_1k", "cpu/1k img/s"),
    ("ok", "verified"),
]


def print_report(report: dict[str, Any]) -> None:
    """Print the machine, its quietness, the readers' table, the sweep's table, the ratios, targets and anchors."""
    print(describe_machine(report["machine"]))
    print(Quietness.from_dict(report["quiet"]).describe())
    if report["readers"]:
        print(format_table(report["readers"], READER_COLUMNS))
    if report["latency_sweep"]:
        print(format_table(report["latency_sweep"], SWEEP_COLUMNS))
    print(f"pinning: {report['pinning']}")
    for name, value in {**report["ratios"], **report["targets"]}.items():
        print(f"{name}: {value}")
    for a in report["anchors"]:
        print(f"{a['anchor']}: theirs {a['theirs']}; ours {a['ours']}")
    if report["skipped"]:
        print(f"skipped: {report['skipped']}")
