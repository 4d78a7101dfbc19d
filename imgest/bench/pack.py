"""`imgest bench pack`: imgest's shard job against webdataset's ShardWriter and LitData's optimize, equal work.

All tools read the same generated dataset and write the same members (.jpg, .cls, .json) in one seeded order,
with as many processes as Spark has cores (local[*]): webdataset's ShardWriter in a process pool (one writer per
process, each on a contiguous slice of the order), LitData with that many workers. The peers run twice: with the
plain Pillow pipeline their users would write ("natural") and with imgest's transform (the packing systems
alone). imgest runs its real Spark job (spark-submit, local master), so its wall time includes starting the JVM
and the Spark session; its in-job time is reported beside it. UNCHANGED packing (decode check, the default, and
the header-only check) is compared with a plain ``tar`` of the same files.

Every tool runs at each dataset size (2,000, 8,000 and 20,000 images by default) for several rounds, in a rotated
order; a least-squares line through the median wall times splits each tool's cost into a fixed start-up part
and a per-image part. The sizes above the first reuse its generated images through hard links under new names,
so the work per image is the same at every size.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from imgest.bench.machine import machine_info
from imgest.bench.measure import fit_line, meets, spread
from imgest.bench.pack_data import BASE_IMAGES, dataset, manifest_files
from imgest.bench.pack_peers import PEER_TRANSFORMS, run_litdata, run_shardwriter, run_tar
from imgest.core import workdir
from imgest.core.report import describe_machine, format_table, pyplot, save_figure, write_json
from imgest.sources.manifest import iter_manifest
from imgest.spark.conf import submit_env
from imgest.spark.submit import submit_command

log = logging.getLogger(__name__)


def run_imgest(manifest: Path, out: Path, mode: str, max_count: int, check: str = "decode") -> dict[str, float]:
    """The real shard job through spark-submit on local[*]: wall time, the job's own time, bytes written."""
    summary = out / "summary.json"
    args = [
        "--manifest-dir",
        str(manifest),
        "--dest",
        str(out / "shards"),
        "--mode",
        mode,
        "--max-count",
        str(max_count),
        "--summary-json",
        str(summary),
        "--unchanged-check",
        check,
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(
        submit_command("pack_shards", args, "local[*]"), env=submit_env(), capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError("imgest pack job failed: " + proc.stderr[-2000:])
    data = json.loads(summary.read_text())
    return {"wall_s": wall, "in_job_s": data["seconds"], "bytes": data["bytes"]}


UNCHANGED_DECODE = "imgest unchanged, decode check"


def tools(cores: int) -> dict[str, Callable[[Path, Path, int], dict[str, float] | None]]:
    """Every contender by name (tool, transform): what it runs on MANIFEST into a work folder."""
    contenders: dict[str, Callable[[Path, Path, int], dict[str, float] | None]] = {
        "imgest Spark job": lambda m, out, mc: run_imgest(m, out, "jpeg", mc),
    }
    for tf in PEER_TRANSFORMS:
        contenders[f"webdataset ShardWriter, {tf} transform"] = (
            lambda m, out, mc, tf=tf: run_shardwriter(m, out, mc, tf, cores)  # type: ignore[misc]
        )
        contenders[f"LitData optimize, {tf} transform"] = lambda m, out, mc, tf=tf: run_litdata(m, out, tf, cores)  # type: ignore[misc]
    contenders[UNCHANGED_DECODE] = lambda m, out, mc: run_imgest(m, out, "unchanged", mc, "decode")
    contenders["imgest unchanged, header check"] = lambda m, out, mc: run_imgest(m, out, "unchanged", mc, "header")
    contenders["GNU tar of the files"] = lambda m, out, mc: run_tar(m, out)
    return contenders


def _warm(manifest: Path) -> None:
    """Read every source file once so that no contender pays for a cold page cache."""
    root, files = manifest_files(manifest)
    for rel, _ in files:
        (root / rel).read_bytes()


def measure_size(images: int, rounds: int, max_count: int, cores: int) -> dict[str, list[dict[str, float]]]:
    """ROUNDS runs of every contender on the IMAGES dataset, the order rotated each round."""
    manifest = dataset(images)
    _warm(manifest)
    source_bytes = sum(c.size for c in iter_manifest(manifest / workdir.MANIFEST))
    contenders = tools(cores)
    names = list(contenders)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            with tempfile.TemporaryDirectory(prefix="imgest-bench-pack-") as tmp:
                result = contenders[name](manifest, Path(tmp), max_count)
            if result is not None:
                runs[name].append({**result, "bytes_in": source_bytes})
            log.info("pack bench: %d images, round %d, %s: %s", images, r + 1, name, result)
    return {name: values for name, values in runs.items() if values}


def summarize(sizes: dict[int, dict[str, list[dict[str, float]]]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rows per (tool, size) with median/min/max, and per tool the fixed and per-image cost."""
    rows: list[dict[str, Any]] = []
    for images, runs in sizes.items():
        for name, values in runs.items():
            wall = spread([v["wall_s"] for v in values])
            in_job = spread([v["in_job_s"] for v in values])
            mb = values[0]["bytes"] / 1e6
            rows.append(
                {
                    "tool": name,
                    "images": images,
                    "rounds": len(values),
                    "wall_s": wall,
                    "in_job_s": in_job,
                    "mb_out": round(mb, 1),
                    "mb_in": round(values[0]["bytes_in"] / 1e6, 1),
                    "images_per_s": round(images / wall["median"], 1),
                    "mb_per_s_wall": round(values[0]["bytes_in"] / 1e6 / wall["median"], 1),
                    "mb_per_s_in_job": round(values[0]["bytes_in"] / 1e6 / in_job["median"], 1),
                }
            )
    return rows, fit_rows(rows)


def fit_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per tool, the line through its median wall times: fixed seconds and wall milliseconds per image."""
    fits = []
    for name in dict.fromkeys(r["tool"] for r in rows):
        points = [(r["images"], r["wall_s"]["median"]) for r in rows if r["tool"] == name]
        fixed, per_image = fit_line([float(x) for x, _ in points], [y for _, y in points])
        fits.append({"tool": name, "fixed_s": round(fixed, 2), "per_image_ms": round(per_image * 1000, 3)})
    return fits


def comparisons(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """imgest's wall time over the fastest peer's, per size: natural transforms, and imgest's transform for all."""
    out = []
    for images in sorted({r["images"] for r in rows}):
        at = {r["tool"]: r["wall_s"]["median"] for r in rows if r["images"] == images}
        ours = at.get("imgest Spark job")
        for tf, target in (("natural", TARGET_VS_NATURAL_PEER), ("imgest", None)):
            peers = {k: v for k, v in at.items() if k.endswith(f", {tf} transform")}
            if ours is None or not peers:
                continue
            best = min(peers, key=lambda k: peers[k])
            ratio = ours / peers[best]
            out.append(
                {
                    "images": images,
                    "peers_transform": tf,
                    "fastest_peer": best,
                    "imgest_wall_s": ours,
                    "peer_wall_s": peers[best],
                    "imgest_vs_fastest_peer": round(ratio, 2),
                    "target": target,
                    "meets_target": meets(ratio, target, at_most=True),
                }
            )
    return out


TARGET_VS_NATURAL_PEER = 0.5  # issue 5: at most half the wall time of the faster peer
TARGET_UNCHANGED_MB_S = 120.0  # issue 18: UNCHANGED packing with the decode check, source MB/s on all cores


def settings(cores: int, max_count: int) -> dict[str, str]:
    """The contenders' settings, printed beside the figures."""
    return {
        "imgest": f"spark-submit --master local[*] ({cores} task slots), pack_shards, max-count {max_count}, "
        "seeded global shuffle, members .jpg/.cls/.json, output to a local folder",
        "webdataset": f"ShardWriter(maxcount={max_count}) in a ProcessPoolExecutor of {cores} processes, each on "
        "a contiguous slice of one seeded order, members .jpg/.cls/.json",
        "litdata": f"optimize(num_workers={cores}, chunk_bytes='64MB', mode='overwrite') over the same seeded "
        "order, members .jpg/.cls/.json as one dict per sample",
        "natural transform": "Pillow: full decode, convert RGB, resize the shorter side to 256 (bilinear), "
        "center-crop 224, JPEG q90",
        "imgest transform": "imgest.transform.image.transform_image (the same function the Spark job runs)",
        "tar": "GNU tar -cf of the same source files (UNCHANGED baseline)",
    }


def run(sizes: list[int], rounds: int, max_count: int) -> dict[str, Any]:
    """Measure every contender at every size; rows, per-tool fits, comparisons and the targets."""
    cores = os.cpu_count() or 1  # local[*] runs one Spark task per core; each peer gets as many processes
    measured = {images: measure_size(images, rounds, max_count, cores) for images in sizes}
    rows, fits = summarize(measured)
    return {
        "benchmark": "pack",
        "sizes": sizes,
        "rounds": rounds,
        "max_count": max_count,
        "cores": cores,
        "base_images": BASE_IMAGES,
        "settings": settings(cores, max_count),
        "machine": machine_info(),
        "rows": rows,
        "fits": fits,
        "comparisons": comparisons(rows),
        "targets": evaluate(rows, fits),
    }


def evaluate(rows: list[dict[str, Any]], fits: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each target at the largest size (fixed start-up included) and per image (the fits' slopes: the rate a
    dataset large enough to hide every start-up cost runs at)."""
    largest = max(r["images"] for r in rows)
    slope = {f["tool"]: f["per_image_ms"] for f in fits}
    natural = [c for c in comparisons(rows) if c["peers_transform"] == "natural" and c["images"] == largest]
    natural_slopes = [v for k, v in slope.items() if k.endswith(", natural transform")]
    per_image = (
        slope["imgest Spark job"] / min(natural_slopes) if natural_slopes and "imgest Spark job" in slope else None
    )
    unchanged = next((r for r in rows if r["tool"] == UNCHANGED_DECODE and r["images"] == largest), None)
    marginal = None
    if unchanged is not None and slope.get(UNCHANGED_DECODE):
        marginal = unchanged["mb_in"] / unchanged["images"] / (slope[UNCHANGED_DECODE] / 1000)
    at_largest = unchanged["mb_per_s_in_job"] if unchanged else None
    return {
        "imgest_vs_fastest_natural_peer": {
            "target": TARGET_VS_NATURAL_PEER,
            "images": largest,
            "wall_ratio_at_largest": natural[0]["imgest_vs_fastest_peer"] if natural else None,
            "per_image_ratio": round(per_image, 2) if per_image else None,
            "met_at_largest": bool(natural and natural[0]["meets_target"]),
            "met_per_image": bool(per_image and per_image <= TARGET_VS_NATURAL_PEER),
        },
        "unchanged_decode_check_mb_per_s": {
            "target": TARGET_UNCHANGED_MB_S,
            "images": largest,
            "in_job_at_largest": at_largest,
            "per_image": round(marginal, 1) if marginal else None,
            "met_at_largest": bool(at_largest and at_largest >= TARGET_UNCHANGED_MB_S),
            "met_per_image": bool(marginal and marginal >= TARGET_UNCHANGED_MB_S),
        },
    }


def _flat(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            **r,
            "wall": f"{r['wall_s']['median']:.2f} ({r['wall_s']['min']:.2f}-{r['wall_s']['max']:.2f})",
            "in_job": f"{r['in_job_s']['median']:.2f}",
            "mb_s": f"{r['mb_per_s_in_job']:.0f} / {r['mb_per_s_wall']:.0f}" if r["tool"].startswith(UNCHANGED) else "",
        }
        for r in rows
    ]


UNCHANGED = ("imgest unchanged", "GNU tar")
COLUMNS = [
    ("tool", "tool"),
    ("images", "images"),
    ("wall", "wall s median (min-max)"),
    ("in_job", "in-job s"),
    ("images_per_s", "img/s"),
    ("mb_out", "MB out"),
    ("mb_s", "MB/s in-job / wall"),
]
FIT_COLUMNS = [("tool", "tool"), ("fixed_s", "fixed s"), ("per_image_ms", "ms per image")]
COMPARISON_COLUMNS = [
    ("images", "images"),
    ("peers_transform", "peers' transform"),
    ("fastest_peer", "fastest peer"),
    ("imgest_vs_fastest_peer", "imgest / peer"),
    ("target", "target"),
]


def main(json_out: Path, plot: Path | None, sizes: list[int], rounds: int, max_count: int) -> dict[str, Any]:
    """Run, print the machine, settings, tables and targets, write JSON (and the plot)."""
    report = run(sizes, rounds, max_count)
    print(describe_machine(report["machine"]))
    for name, value in report["settings"].items():
        print(f"  {name}: {value}")
    print(format_table(_flat(report["rows"]), COLUMNS))
    print(format_table(report["fits"], FIT_COLUMNS))
    print(format_table(report["comparisons"], COMPARISON_COLUMNS))
    for name, t in report["targets"].items():
        figures = {k: v for k, v in t.items() if k not in ("target", "images")}
        print(f"target {name} ({t['target']}; largest size {t['images']} images): {figures}")
    write_json(json_out, report)
    if plot is not None:
        plot_sweep(plot, report)
    return report


def plot_sweep(path: Path, report: dict[str, Any]) -> None:
    """Wall time against images per tool (median, min-max bars), and the per-image cost of each."""
    plt = pyplot()

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.5), gridspec_kw={"width_ratios": [3, 2]})
    for name in dict.fromkeys(r["tool"] for r in report["rows"]):
        points = sorted((r["images"], r["wall_s"]) for r in report["rows"] if r["tool"] == name)
        xs = [x for x, _ in points]
        med = [w["median"] for _, w in points]
        err = [[w["median"] - w["min"] for _, w in points], [w["max"] - w["median"] for _, w in points]]
        style = "--" if name.startswith(UNCHANGED) else "-"
        left.errorbar(xs, med, yerr=err, fmt=style + "o", capsize=3, label=name, linewidth=2 if "Spark" in name else 1)
    left.set_xlabel("images")
    left.set_ylabel("wall seconds (median of rounds; bars: min-max)")
    left.set_title(f"Packing shards on {report['cores']} cores, {report['rounds']} rounds per point")
    left.legend(fontsize=7)
    left.grid(alpha=0.3)
    fits = report["fits"]
    names = [f["tool"] for f in fits]
    right.barh(names, [f["per_image_ms"] for f in fits], color="tab:blue")
    for i, f in enumerate(fits):
        right.text(
            f["per_image_ms"], i, f" {f['per_image_ms']:.2f} ms + {f['fixed_s']:.1f} s fixed", va="center", fontsize=7
        )
    right.set_xlabel("wall ms per image (slope of the fit)")
    right.invert_yaxis()
    right.tick_params(axis="y", labelsize=7)
    right.set_title("Per-image cost and fixed start-up")
    save_figure(fig, path)
