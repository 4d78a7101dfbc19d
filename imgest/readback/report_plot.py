"""The read-back check's plot: each reader's steady rate beside its start-up, so that neither passes for the other.

Left, per reader and mode, the steady rate (images/s after its warm-up batches, verification included); a rate
measured over fewer batches than its window is drawn hatched and labelled "not steady" (it is start-up, not a
throughput). Right, each reader's time to its first batch (its pipeline's build included). Both on log scales:
the readers' rates span three orders of magnitude.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_check(path: Path, rows: list[dict[str, Any]], title: str = "Read-back check") -> None:
    """Draw ROWS (the report's readers) to PATH (PNG)."""
    from imgest.core.report import pyplot, save_figure

    readers = list(dict.fromkeys(r["reader"] for r in rows))
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    by = {(r["reader"], r["mode"]): r for r in rows}
    fig, (rate_ax, start_ax) = pyplot().subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    from matplotlib.patches import Patch

    width = 0.8 / max(1, len(modes))
    handles = []
    for i, mode in enumerate(modes):
        xs = [g + i * width for g in range(len(readers))]
        got = [by.get((name, mode)) for name in readers]
        rates = [max(r["steady_rate"], 0.1) if r else 0.0 for r in got]
        bars = rate_ax.bar(xs, rates, width, label=mode)
        handles.append(Patch(color=bars.patches[0].get_facecolor(), label=mode))
        for bar, r in zip(bars, got, strict=True):
            if r is None:
                continue
            if not r["steady"]:
                bar.set_hatch("//")
                bar.set_alpha(0.5)
            text = f"{r['steady_rate']:,.0f}" if r["steady"] else f"{r['steady_rate']:,.0f}\nnot steady"
            rate_ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", fontsize=7)
        starts = [r["startup_s"] if r else 0.0 for r in got]
        start_ax.barh([g + i * width for g in range(len(readers))], starts, width, label=mode)
    ticks = [g + width * (len(modes) - 1) / 2 for g in range(len(readers))]
    rate_ax.set_xticks(ticks, readers, rotation=20, ha="right", fontsize=8)
    rate_ax.set_yscale("log")
    lowest = min((max(r["steady_rate"], 0.1) for r in rows), default=1.0)
    rate_ax.set_ylim(bottom=max(0.1, lowest / 5))
    rate_ax.set_ylabel("steady rate, images/s (verified)")
    rate_ax.set_title(f"{title}: steady rate after warm-up (hatched: not steady)", fontsize=9)
    handles.append(Patch(facecolor="white", edgecolor="grey", hatch="//", label="not steady (start-up)"))
    rate_ax.legend(handles=handles, fontsize=8)
    start_ax.set_yticks(ticks, readers, fontsize=8)
    start_ax.set_xlabel("seconds to the first batch (pipeline build included)")
    start_ax.set_title("start-up", fontsize=9)
    start_ax.invert_yaxis()
    fig.tight_layout()
    save_figure(fig, path)
