"""`imgest bench plugin`'s tables and plot (the measurement is imgest.bench.plugin)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from imgest.core.report import describe_machine, format_table

READER_COLUMNS = [
    ("reader", "reader"),
    ("mode", "mode"),
    ("images", "images"),
    ("images_per_s", "img/s"),
    ("min", "min"),
    ("max", "max"),
    ("cores_per_1k", "cpu/1k img/s"),
    ("first_batch_ms", "1st batch ms"),
    ("verified", "verified"),
]
SWEEP_COLUMNS = [
    ("condition", "condition"),
    ("epoch", "epoch"),
    ("imgest_images_per_s", "imgest img/s"),
    ("plugin_best", "plugin's best"),
    ("plugin_images_per_s", "its img/s"),
    ("ratio", "ratio"),
    ("imgest_cores_per_1k", "imgest cpu/1k"),
    ("plugin_cores_per_1k", "its cpu/1k"),
]


def print_report(report: dict[str, Any]) -> None:
    """The tables, the quietness of each part and the targets."""
    print(describe_machine(report["machine"]))
    for part, quiet in report["quiet"].items():
        verdict = "quiet" if quiet["quiet"] else "NOT QUIET"
        print(
            f"{part}: {quiet['seconds']:.0f} s, other processes {quiet['other_cores']:.2f} cores (kernel threads "
            f"{quiet['kernel_cores']:.2f}), load "
            f"{quiet['load_start'][0]:.2f} -> {quiet['load_end'][0]:.2f}: {verdict}"
        )
    if report.get("readers"):
        print(format_table(report["readers"], READER_COLUMNS))
    if report.get("sweep_compare"):
        print(format_table(report["sweep_compare"], SWEEP_COLUMNS))
    if report.get("ring_compare"):
        ring = report["ring"]
        print(
            f"three-node ring {', '.join(ring['nodes'])} behind proxies {', '.join(ring['proxies'])}, "
            f"replication {ring['replication']}, {ring['images']} images per epoch:"
        )
        print(format_table(report["ring_compare"], SWEEP_COLUMNS))
    if "loop_read" in report:
        lr = report["loop_read"]
        print(
            f"the plugin's loop_read.py on the imgest table: {lr['plugin_loop_read']['images_per_s']:.0f} images/s "
            f"({lr['plugin_loop_read']['printed']}); imgest's reader: {lr['imgest_reader']['images_per_s']:.0f} "
            f"images/s; ratio {lr['ratio']}"
        )
    if "writers" in report:
        print_writers(report["writers"])
    for name, met in report["targets"].items():
        print(f"{'met' if met else 'NOT met'}: {name}")


def plot(path: Path, report: dict[str, Any]) -> None:
    """Readers at 0 ms (raw, train), the sweep per condition, and writers + loop_read side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(28, 5.5), gridspec_kw={"width_ratios": [1, 1, 1, 1.8]})
    for ax, mode in zip(axes[:2], ("raw", "train"), strict=True):
        if report.get("readers"):
            _readers(ax, report["readers"], mode)
    if report.get("latency_sweep"):
        _sweep(axes[2], report["latency_sweep"])
    _sides(axes[3], report)
    quiet = all(q["quiet"] for q in report["quiet"].values())
    fig.suptitle(f"imgest beside cassandra-dali-plugin 1.3.2 ({'quiet machine' if quiet else 'machine NOT quiet'})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _readers(ax: Any, rows: list[dict[str, Any]], mode: str) -> None:
    mine = [r for r in rows if r["mode"] == mode]
    labels = ["imgest (defaults)" if r["reader"] == "cassandra" else r["reader"] for r in mine]
    colors = ["tab:blue" if r["reader"] == "cassandra" else "tab:grey" for r in mine]
    bars = ax.bar(range(len(mine)), [r["images_per_s"] for r in mine], color=colors)
    ax.bar_label(bars, labels=[f"{r['images_per_s']:.0f}\n{r['cores_per_1k']:.2f} cpu/1k" for r in mine], fontsize=7)
    ax.set_xticks(range(len(mine)), labels, rotation=20, ha="right")
    ax.set_ylabel("images/s (epoch rate, median of rounds)")
    what = "raw bytes" if mode == "raw" else "CPU decode + random resized crop + flip + normalize"
    ax.set_title(f"Readers at 0 ms, direct: {what}", fontsize=9)


def _sweep(ax: Any, sweep: list[dict[str, Any]]) -> None:
    conds = list(dict.fromkeys(s["condition"] for s in sweep))
    for reader in dict.fromkeys(s["reader"] for s in sweep):
        mine = [s for s in sweep if s["reader"] == reader]
        epoch = "second" if any(s["epoch"] == "second" for s in mine) else "first"
        pts = [next((s["images_per_s"] for s in mine if (s["condition"], s["epoch"]) == (c, epoch)), 0) for c in conds]
        label = ("imgest (adaptive window)" if reader == "cassandra" else reader) + f", {epoch} epoch"
        ax.plot(range(len(conds)), pts, marker="o", label=label)
    ax.set_xticks(range(len(conds)), conds, rotation=20, ha="right")
    ax.set_ylim(bottom=0)
    ax.set_ylabel("images/s, raw bytes")
    ax.set_title("Through Toxiproxy: added round trip")
    ax.legend(fontsize=7)


def print_writers(w: dict[str, Any]) -> None:
    """Each writer at both sizes, its fixed cost and steady rate, the ratios and the CPU-bound ceiling."""
    from imgest.bench.plugin_writers import IMGEST_SIDES, SIDES

    for side in SIDES:
        if side not in w:
            continue
        one = w[side]
        small = one.get("small", {})
        print(
            f"{one['writer']}: {one['rows']} rows in {one['seconds']} s = {one['images_per_s']} images/s"
            f" ({small.get('rows')} rows: {small.get('images_per_s')} images/s); fixed {one.get('fixed_s')} s,"
            f" steady {one.get('steady_images_per_s')} images/s; CPU per row: server {one['server_cpu_ms_per_row']}"
            f" ms, writer {one['client_cpu_ms_per_row']} ms; per further row: server"
            f" {one.get('server_cpu_ms_per_row_marginal')} ms, writer {one.get('client_cpu_ms_per_row_marginal')} ms"
            + (f"; node quiet 3 s at {one['server_settle_s']} s after it" if "server_settle_s" in one else "")
        )
        if one.get("phase_seconds"):
            print(f"  job phases (s): {one['phase_seconds']}")
    for side in IMGEST_SIDES:
        if f"ratio_{side}" in w:
            print(f"writer ratio {side} / plugin: {w[f'ratio_{side}']} as run, {w[f'steady_ratio_{side}']} steady")
    if "cpu_bound_ceiling" in w:
        c = w["cpu_bound_ceiling"]
        print(
            f"CPU-bound ceiling through this server: {c['images_per_s']} images/s on {c['cores']} cores"
            f" = {c['ratio_to_plugin_steady']}x the plugin's steady rate, whatever the writer's own cost"
        )


def _sides(ax: Any, report: dict[str, Any]) -> None:
    names, ours, theirs = [], [], []
    for row in report.get("ring_compare", []):
        if row["epoch"] == "second":
            names.append(f"{row['condition']}\n2nd epoch")
            theirs.append(row["plugin_images_per_s"])
            ours.append(row["imgest_images_per_s"])
    if "writers" in report:
        w = report["writers"]
        shown = (
            ("imgest", "CQL"),
            ("imgest-helper-header", "cql-helper,\nheader"),
            ("imgest-bulk", "bulk"),
            ("imgest-bulk-header", "bulk,\nheader"),
        )
        for side, writer in shown:
            if side not in w:
                continue
            for key, label in (("images_per_s", "as run"), ("steady_images_per_s", "steady")):
                if w[side].get(key) and w["plugin"].get(key):
                    names.append(f"{writer}\n{label}")
                    theirs.append(w["plugin"][key])
                    ours.append(w[side][key])
    if "loop_read" in report:
        names.append("its\nloop_read.py")
        theirs.append(report["loop_read"]["plugin_loop_read"]["images_per_s"])
        ours.append(report["loop_read"]["imgest_reader"]["images_per_s"])
    x = range(len(names))
    for k, (values, label) in enumerate(((theirs, "cassandra-dali-plugin"), (ours, "imgest"))):
        bars = ax.bar([i + k * 0.4 for i in x], values, 0.4, label=label)
        ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.set_xticks([i + 0.2 for i in x], names, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("images/s (log scale)")
    ax.set_title("The three-node ring, the writers (as run, steady), the plugin's own loop_read.py")
    ax.legend()
