"""The check's outputs: a JSON report, a table, a bar chart PNG and the block map (numpy columns)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from imgest.core.report import bar_chart, format_table, machine_info, optional_plot, pyplot, save_figure, write_json
from imgest.transform import fastjpeg
from imgest.validate.blockmap import write_block_map
from imgest.validate.check import EngineResult
from imgest.validate.runner import CheckReport

BASELINE = "python_file"
COLUMNS = [
    ("engine", "engine"),
    ("status", "status"),
    ("checked", "checked"),
    ("img_s", "img/s"),
    ("mb_s", "MB/s"),
    ("relative_to_python_file", "x python_file"),
    ("queue_depth", "QD"),
    ("backend", "backend"),
]


def engine_row(result: EngineResult, base: float | None) -> dict[str, Any]:
    """One engine as a flat, JSON-ready row (rates relative to the Python file API when it ran)."""
    rate = result.img_s
    return {
        "engine": result.engine,
        "status": result.status,
        "reason": result.reason,
        "images": result.images,
        "checked": result.checked,
        "bytes": result.nbytes,
        "seconds": result.seconds,
        "img_s": rate,
        "mb_s": result.mb_s,
        "relative_to_python_file": rate / base if rate and base else None,
        "queue_depth": result.info.get("queue_depth"),
        "backend": result.info.get("backend"),
        "info": result.info,
        "mismatches": result.mismatched,
        "label_mismatches": result.label_mismatched,
    }


def selection(report: CheckReport) -> dict[str, Any]:
    """What part of the dataset was checked: the sample size asked for (0: every image), the images checked, whether
    that is every image, and per split its rows, the images checked and their balance over the classes."""
    splits = {s.split: s.sample.to_dict() for s in report.splits}
    return {
        "sample": report.config.sample,
        "sample_seed": report.config.seed,
        "checked": sum(len(s) for s in report.splits),
        "full": all(s.full for s in report.splits),
        "splits": splits,
    }


def report_dict(report: CheckReport) -> dict[str, Any]:
    """The whole report as JSON-ready data; mismatches are listed by path and engine with both hashes."""
    base = report.result(BASELINE)
    base_rate = base.img_s if base else None
    rows = [engine_row(r, base_rate) for r in report.results]
    xnvme = [r["relative_to_python_file"] for r in rows if r["engine"].startswith("xnvme") and r["img_s"]]
    xnvme += [r["relative_to_python_file"] for r in report.sweep if r["relative_to_python_file"]]
    return {
        "ok": report.ok,
        "dataset": str(report.root),
        "config": asdict(report.config),
        "machine": machine_info(**fastjpeg.machine_fields()),
        "timing": "seconds inside pipe.run() per pass, median of the timed passes; the verifying pass is untimed",
        "cache": _cache(report),
        **selection(report),
        "engines": rows,
        "skipped": {r.engine: r.reason for r in report.results if r.status == "skipped"},
        "mismatches": [m for r in report.results for m in r.mismatches],  # the first LISTED per engine
        "label_mismatches": [m for r in report.results for m in r.label_mismatches],
        "mismatch_count": sum(r.mismatched + r.label_mismatched for r in report.results),
        "best_xnvme_relative_to_python_file": max(xnvme) if xnvme else None,  # the sweep included
        "block_map": None
        if report.block_map is None
        else {
            "device": str(report.block_map.device),
            "files": len(report.block_map),
            "fallbacks": report.block_map.fallback_counts(),
        },
        "queue_depth_sweep": report.sweep,
    }


def _cache(report: CheckReport) -> str:
    if not report.config.cold:
        return "warm: the images are read from the page cache after the verifying pass"
    also = f" and {', '.join(report.config.evict_also)}" if report.config.evict_also else ""
    return f"cold: every timed pass reads the images from the device (their pages{also} dropped before it)"


def summary_text(doc: dict[str, Any]) -> str:
    """The engines table, the sweep table when there is one, skips and mismatches, as text."""
    what = "every image" if doc["full"] else f"a seeded class-balanced sample of {doc['sample']} per split"
    cache = f"; page cache {doc['cache']}" if doc.get("cache") else ""
    parts = [f"checked {doc['checked']} images ({what}){cache}", format_table(doc["engines"], COLUMNS)]
    if doc["queue_depth_sweep"]:
        parts.append(
            format_table(
                doc["queue_depth_sweep"],
                [("engine", "engine"), ("queue_depth", "QD"), ("img_s", "img/s"), ("relative_to_python_file", "x py")],
            )
        )
    parts += [f"skipped {engine}: {reason}" for engine, reason in doc["skipped"].items()]
    parts += [
        f"MISMATCH {m['engine']} {m['path']}: expected {m['expected']}, read {m['actual']}" for m in doc["mismatches"]
    ]
    parts += [
        f"LABEL {m['engine']} {m['path']}: {m['label']}, fn.readers.file says {m['reader_label']}"
        for m in doc["label_mismatches"]
    ]
    return "\n".join(parts)


def write_outputs(
    report: CheckReport, json_path: Path, plot_path: Path | None, map_path: Path | None
) -> tuple[dict[str, Any], Path | None]:
    """Write the JSON report (and the plot, and the block map columns when there is one); returns the report and
    the plot's path (None: none drawn, as where matplotlib is not installed or no engine ran)."""
    doc = report_dict(report)
    write_json(json_path, doc)
    ran = [r for r in doc["engines"] if r["img_s"]]
    plot = None
    if plot_path is not None and ran:
        plot = optional_plot(plot_path, lambda path: _plots(path, report, doc, ran))
    if map_path is not None and report.block_map is not None:
        write_block_map(map_path, report.block_map)
    return doc, plot


def _plots(path: Path, report: CheckReport, doc: dict[str, Any], ran: list[dict[str, Any]]) -> None:
    """The engines' bar chart at PATH, and the queue-depth sweep's beside it when there is one."""
    bar_chart(
        path,
        f"xNVMe validation: read engines into one pipeline (batch {report.config.batch_size}, "
        f"{'cold' if report.config.cold else 'warm'} page cache)",
        [r["engine"] for r in ran],
        {"img/s": [r["img_s"] for r in ran]},
        "images/s",
    )
    if doc["queue_depth_sweep"]:
        sweep_plot(sweep_plot_path(path), doc)


def sweep_plot_path(plot_path: Path) -> Path:
    """Where the queue-depth sweep's plot goes beside the engines' plot: <name>-sweep.png."""
    return plot_path.with_name(f"{plot_path.stem}-sweep{plot_path.suffix}")


def sweep_plot(path: Path, doc: dict[str, Any]) -> None:
    """images/s of each xNVMe engine against its queue depth (log scale), with python_file and DALI's file reader
    (one read at a time) as horizontal lines: where queue depth pays."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for engine in ("xnvme_file", "xnvme_block"):
        rows = sorted((r for r in doc["queue_depth_sweep"] if r["engine"] == engine), key=lambda r: r["queue_depth"])
        if rows:
            ax.plot([r["queue_depth"] for r in rows], [r["img_s"] for r in rows], marker="o", label=engine)
    styles = {"python_file": ":", "dali_file": "--"}
    for row in doc["engines"]:
        if row["engine"] in styles and row["img_s"]:
            label = f"{row['engine']} ({row['img_s']:.0f})"
            ax.axhline(row["img_s"], color="grey", linestyle=styles[row["engine"]], label=label)
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("queue depth (reads in flight)")
    ax.set_ylabel("images/s (median of timed passes)")
    cache = str(doc.get("cache", "warm")).split(":", 1)[0]
    ax.set_title(f"xNVMe engines against queue depth, {cache} page cache")
    ax.legend(fontsize=8)
    save_figure(fig, path)
