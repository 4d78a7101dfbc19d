"""The check's outputs: a JSON report, a table, a bar chart PNG and the block map (numpy columns)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from imgest.bench.report import bar_chart, format_table, machine_info, write_json
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
        "machine": machine_info(),
        "timing": "seconds inside pipe.run() per pass, median of the timed passes; the verifying pass is untimed",
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


def summary_text(doc: dict[str, Any]) -> str:
    """The engines table, the sweep table when there is one, skips and mismatches, as text."""
    what = "every image" if doc["full"] else f"a seeded class-balanced sample of {doc['sample']} per split"
    parts = [f"checked {doc['checked']} images ({what})", format_table(doc["engines"], COLUMNS)]
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


def write_outputs(report: CheckReport, json_path: Path, plot_path: Path | None, map_path: Path | None) -> dict:
    """Write the JSON report (and the plot, and the block map columns when there is one); returns the report."""
    doc = report_dict(report)
    write_json(json_path, doc)
    ran = [r for r in doc["engines"] if r["img_s"]]
    if plot_path is not None and ran:
        bar_chart(
            plot_path,
            f"xNVMe validation: read engines into one DALI pipeline (batch {report.config.batch_size})",
            [r["engine"] for r in ran],
            {"img/s": [r["img_s"] for r in ran]},
            "images/s",
        )
    if map_path is not None and report.block_map is not None:
        write_block_map(map_path, report.block_map)
    return doc
