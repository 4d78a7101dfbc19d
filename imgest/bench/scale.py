"""`imgest bench scale`: the whole `ingest_imagenet` path at 1 %, 10 % and 100 % of a dataset, step by step.

Every step (scan, prepare, ingest, verify, split, read-back) runs in a process of its own through
`imgest.bench.scale_step`, calling the function the DAG's task calls. A sampler follows the step's process
tree and the embedded servers and records, per step: wall time, peak RSS of the step process (the Airflow
task or CLI), of the Spark driver JVM and of the largest Spark Python worker, their sum at any instant, and
the servers'. Time and memory ratios between the two largest sizes show what grows faster than the data; a
fixed start-up cost (from a straight-line fit over the sizes) is shown separately.

With ``refresh`` (``--refresh``), the path of the `refresh_<name>` DAG is measured instead: a first version, a
refresh without change and a 0.1 % change, each sub-step in its own process (`imgest.bench.scale_refresh`).

Datasets: `count` is ImageNet's count in small JPEGs (`imgest.sources.devdata.countscale`); `bytes` is
100,000 ImageNet-size images (2,000 distinct, hard-linked to 100,000 paths: the bytes are ImageNet's, the
per-image work identical).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path
from typing import Any

from imgest.bench.machine import machine_info
from imgest.bench.measure import fixed_cost
from imgest.bench.scale_run import STEPS, peak, peak_role, reset_dataset, run_step, stored_bytes
from imgest.core.paths import state_dir
from imgest.core.report import describe_machine, format_table, pyplot, save_figure, write_json

log = logging.getLogger(__name__)

TARGET_TIME_RATIO = 11.0
TARGET_RSS_RATIO = 1.5
TARGET_RSS_BYTES = 2 << 30


def run_size(kind: str, label: str, source: Path | str, images: int, target: str, out: Path) -> list[dict[str, Any]]:
    """Every step of TARGET over SOURCE (IMAGES images), each measured; returns one row per step. TARGET
    cassandra writes through CQL, cassandra-bulk through the bulk loader (--write-path), shards packs shards."""
    from imgest.core.settings import S3Settings

    base, _, write_path = target.partition("-")

    dataset = f"scale-{kind}-{label}-{target}"
    keyspace = dataset.replace("-", "_")
    dest = f"s3://{S3Settings.from_env().bucket}/{dataset}"
    reset_dataset(dataset, keyspace, dest)
    conf = {
        "source": str(source),
        "layout": "tar" if kind == "count21k" else "cls-loc",
        "dataset": dataset,
        "target": base,
        "keyspace": keyspace,
        "s3_dest": dest,
        "write_path": write_path or "cql",  # cassandra: the CQL path, as every earlier figure of it
    }
    from imgest.flow.steps import validate_conf

    state = {"conf": validate_conf(conf), "dest": dest, "verify_sample": 32}
    run_dir = out / dataset
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    state_file, log_file = run_dir / "state.json", run_dir / "steps.log"
    rows = []
    for step in STEPS[base]:
        state_file.write_text(json.dumps(state, indent=1))
        print(f"  {target} {label} ({images:,} images): {step} ...", end="", flush=True)
        row = run_step(step, state_file, log_file)
        state["run_s"] = round(state.get("run_s", 0.0) + row["wall_s"], 2)  # the run so far: the read-back's share
        if step == "scan":
            state["work"] = row["result"]["manifest_dir"]
            state["scan"] = row["result"]
        if step.startswith("ingest_"):
            row["bytes_written"] = stored_bytes(row["result"])
        row.update(target=target, size=label, images=images, rows_per_s=round(images / row["wall_s"], 1))
        print(f" {row['wall_s']:.1f} s, peak RSS {peak(row) / 2**20:.0f} MiB ({peak_role(row)})", flush=True)
        rows.append(row)
    return rows


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per target and step: times, RSS, the ratios of the two largest sizes, and whether each target is met."""
    out = []
    for target in dict.fromkeys(r["target"] for r in rows):
        for step in dict.fromkeys(r["step"] for r in rows if r["target"] == target):  # in the order they ran
            points = sorted((r for r in rows if r["target"] == target and r["step"] == step), key=lambda r: r["images"])
            if len(points) < 1:
                continue
            fixed, per_image = fixed_cost([(p["images"], p["wall_s"]) for p in points])
            big = points[-1]
            entry: dict[str, Any] = {
                "target": target,
                "step": step,
                "images": [p["images"] for p in points],
                "wall_s": [p["wall_s"] for p in points],
                "fixed_s": round(fixed, 2),
                "per_image_ms": round(per_image * 1000, 4),
                "peak_rss_mib": [round(peak(p) / 2**20) for p in points],
                "peak_rss_role": peak_role(big),
                "rows_per_s": big["rows_per_s"],
            }
            if len(points) >= 2:
                small = points[-2]
                entry["time_ratio"] = round(big["wall_s"] / small["wall_s"], 2)
                # Without the fixed cost, where the smaller size did enough per-image work to measure (a step that
                # is mostly fixed cost at 10 % is flat, not superlinear).
                varying = small["wall_s"] - fixed
                excl = (big["wall_s"] - fixed) / varying if varying >= 0.25 * small["wall_s"] else None
                entry["time_ratio_excl_fixed"] = round(excl, 2) if excl is not None else None
                entry["rss_ratio"] = round(peak(big) / max(peak(small), 1), 2)
                entry["time_met"] = (
                    min(entry["time_ratio"], excl if excl is not None else math.inf) <= TARGET_TIME_RATIO
                )
                entry["rss_met"] = entry["rss_ratio"] <= TARGET_RSS_RATIO and peak(big) <= TARGET_RSS_BYTES
            out.append(entry)
    return out


def plot(path: Path, summary: list[dict[str, Any]], title: str) -> None:
    """Log-log time and peak RSS against images, one line per step, a row of panels per target."""
    import matplotlib.ticker

    plt = pyplot()

    targets = list(dict.fromkeys(s["target"] for s in summary))
    fig, axes = plt.subplots(len(targets), 2, figsize=(11, 4.2 * len(targets)), squeeze=False)
    for row, target in enumerate(targets):
        for entry in (s for s in summary if s["target"] == target):
            axes[row][0].plot(entry["images"], entry["wall_s"], marker="o", label=entry["step"])
            axes[row][1].plot(entry["images"], entry["peak_rss_mib"], marker="o", label=entry["step"])
        xs = sorted({n for s in summary if s["target"] == target for n in s["images"]})
        if len(xs) >= 2:  # the linear reference: time proportional to images
            top = max(max(s["wall_s"]) for s in summary if s["target"] == target)
            axes[row][0].plot(xs, [top * x / xs[-1] for x in xs], "k:", label="linear")
        axes[row][1].axhline(TARGET_RSS_BYTES / 2**20, color="r", linestyle=":", label="2 GiB target")
        for col, ylabel in enumerate(("wall time (s)", "peak RSS of the largest process (MiB)")):
            ax = axes[row][col]
            ax.set_xscale("log")
            ax.set_yscale("log")
            plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
            ax.yaxis.set_major_formatter(plain)
            some = matplotlib.ticker.FuncFormatter(  # minor ticks: label 2 and 5 of each decade only
                lambda v, _: f"{v:g}" if v > 0 and round(v / 10 ** math.floor(math.log10(v))) in (2, 5) else ""
            )
            ax.yaxis.set_minor_formatter(some)
            ax.set_xlabel("images")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{target}: {ylabel.split(' (')[0]}")
            ax.grid(True, which="both", alpha=0.3)
        axes[row][0].legend(fontsize=7)
    fig.suptitle(title)
    save_figure(fig, path)


def prepare_datasets(kind: str, fractions: list[float]) -> list[tuple[str, Path | str, int]]:
    """(label, source, images) for each fraction of the KIND dataset, generated once and cached (count21k: the
    tars uploaded to the S3 source bucket, the source an s3:// URL)."""
    if kind == "count21k":
        return prepare_count21k(fractions)
    from imgest.sources.devdata.countscale import (
        BYTE_SCALE,
        CountScaleSpec,
        counts_of,
        link_fraction,
        write_count_scale,
    )

    spec = CountScaleSpec() if kind == "count" else BYTE_SCALE
    root = state_dir() / "bench" / f"{kind}-scale"
    full = write_count_scale(root / "full", spec)
    made = [(f, link_fraction(full, root / f"f{f:g}", spec, f)) for f in fractions]
    return [(f"{f * 100:g}pct", path, sum(counts_of(path).values())) for f, path in made]


def prepare_count21k(
    fractions: list[float], spec: Any = None, root: Path | None = None, prefix: str = "count21k"
) -> list[tuple[str, Path | str, int]]:
    """Each fraction's tar of SPEC's class tars (ImageNet-21k's 21,841 by default) under ROOT, generated once and
    uploaded once to s3://imgest-src/PREFIX/."""
    from boto3.s3.transfer import TransferConfig

    from imgest.bench.source_scan import BUCKET
    from imgest.core.settings import S3Settings
    from imgest.sources.devdata.count21k import TAR_NAME, Count21kSpec, images_of, write_count21k

    spec, client = spec or Count21kSpec(), S3Settings.from_env().client()
    root = root or state_dir() / "bench" / "count21k"
    if BUCKET not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket=BUCKET)
    out = []
    for fraction, path in zip(fractions, write_count21k(root, fractions, spec), strict=True):
        key = f"{prefix}/f{fraction:g}/{TAR_NAME}"
        try:
            there = client.head_object(Bucket=BUCKET, Key=key)["ContentLength"]
        except client.exceptions.ClientError:
            there = None
        if there != path.stat().st_size:
            print(f"  uploading {path} ({path.stat().st_size / 2**20:,.0f} MiB) to s3://{BUCKET}/{key}", flush=True)
            client.upload_file(str(path), BUCKET, key, Config=TransferConfig(multipart_chunksize=64 << 20))
        out.append((f"{fraction * 100:g}pct", f"s3://{BUCKET}/{key}", images_of(spec, fraction)))
    return out


def main(
    json_path: Path,
    plot_path: Path | None,
    kind: str,
    fractions: list[float],
    targets: list[str],
    refresh: bool = False,
) -> dict[str, Any]:
    """Run every size and target (the ingest path, or with REFRESH the refresh path); print the per-step table;
    write JSON (and the plot)."""
    from imgest.bench.scale_refresh import run_refresh_size

    info = machine_info()
    print(describe_machine(info))
    datasets = prepare_datasets(kind, fractions)
    out = state_dir() / "bench" / "scale-runs"
    rows: list[dict[str, Any]] = []
    run = run_refresh_size if refresh else run_size
    for target in targets:
        for label, source, images in datasets:
            rows += run(kind, label, source, images, target, out)
            _write(json_path, kind, info, rows, plot_path)
    report = _write(json_path, kind, info, rows, plot_path)
    columns = [
        ("target", "target"),
        ("step", "step"),
        ("images", "images"),
        ("wall_s", "wall s"),
        ("fixed_s", "fixed s"),
        ("time_ratio", "t ratio"),
        ("time_ratio_excl_fixed", "t ratio-fixed"),
        ("peak_rss_mib", "peak RSS MiB"),
        ("peak_rss_role", "in"),
        ("rss_ratio", "RSS ratio"),
        ("rows_per_s", "img/s"),
    ]
    print(format_table(report["summary"], columns))
    if refresh:
        print(format_table(report["refresh"], REFRESH_COLUMNS))
    for target in targets:
        total = sum(r["wall_s"] for r in rows if r["target"] == target and r["images"] == datasets[-1][2])
        slowest = max(
            (r for r in rows if r["target"] == target and r["images"] == datasets[-1][2]),
            key=lambda r: r["wall_s"],
            default=None,
        )
        if slowest:
            print(
                f"{target} at {datasets[-1][2]:,} images: {total:.0f} s in all; slowest step {slowest['step']} "
                f"({slowest['wall_s']:.0f} s)"
            )
    return report


REFRESH_COLUMNS = [
    ("target", "target"),
    ("phase", "refresh"),
    ("images", "images"),
    ("changed", "changed"),
    ("wall_s", "wall s"),
    ("after_scan_s", "after scan s"),
    ("s_per_changed_image", "s/changed img"),
    ("cost_vs_first", "vs first"),
    ("marginal_ms_per_changed_image", "marginal ms/changed"),
    ("proportional", "proportional"),
]


def _write(path: Path, kind: str, info: dict[str, Any], rows: list[dict[str, Any]], plot_path: Path | None) -> dict:
    from imgest.bench.scale_refresh import summarize_refresh

    summary = summarize(rows)
    refresh = any(r.get("phase") for r in rows)
    report: dict[str, Any] = {
        "benchmark": f"scale-{kind}{'-refresh' if refresh else ''}",
        "machine": info,
        "targets": {"time_ratio": TARGET_TIME_RATIO, "rss_ratio": TARGET_RSS_RATIO, "rss_bytes": TARGET_RSS_BYTES},
        "summary": summary,
        "runs": rows,
    }
    if refresh:
        report["refresh"] = summarize_refresh(rows)
    write_json(path, report)
    if plot_path and summary:
        what = "the refresh_<name> path" if refresh else "every step of ingest_imagenet"
        plot(plot_path, summary, f"imgest bench scale ({kind}): {what}")
    return report
