"""`imgest bench source`: ingest images/s from a local source vs the same dataset on S3, 0 ms and added RTT.

Same generated dataset per layout (ImageFolder folders, ImageNet's tar of class tars + val tar), same job (the
files target's Spark job on ``local[N]``), same cores, same transform. The S3 source lives in the embedded
SeaweedFS and is read through a Toxiproxy proxy that adds each RTT in turn (0 ms: the proxy alone). Figures are
the job's own in-job images/s (Spark's start-up excluded) and the spark-submit wall time, median of ROUNDS, and
the ratio to the local source of the same layout. The scan is timed too (objects/s of listing or tar indexing).

``scan_main`` (``--scan-objects N``) scans a prefix of N objects (ImageFolder, 1,000 per class; tiny bodies: a
scan reads no image) and the same tree on the local disk, each in a fresh process, and reports objects/s and
the process's peak RSS: memory stays bounded when the listing streams page by page into the manifest.
"""

from __future__ import annotations

import json
import logging
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from imgest.bench.measure import busy_seconds, meets, tree_seconds
from imgest.bench.source_scan import BUCKET, scan_main
from imgest.core.paths import state_dir
from imgest.core.report import bar_chart, write_json
from imgest.core.settings import S3Settings, env_int

log = logging.getLogger(__name__)

PROXY = "s3-source"
TARGET_RATIO = 0.9  # the target: an S3 source ingests at >= 0.9x the local images/s


def _dataset(layout: str, images: int) -> Path:
    """The generated dataset of LAYOUT with about IMAGES train images (made once under $IMGEST_HOME/bench)."""
    from imgest.sources.devdata.sample import SampleSpec, write_sample

    classes = 10
    root = state_dir() / "bench" / "source" / f"{layout}-{images}"
    if not (root / ".complete").is_file():
        shutil.rmtree(root, ignore_errors=True)
        spec = SampleSpec(layout, classes=classes, per_class=max(1, images // classes), val_per_class=5, seed=11)
        write_sample(root, spec)
        (root / ".complete").write_text("")
    return root


def _upload(settings: S3Settings, root: Path, prefix: str) -> str:
    """ROOT's files under s3://imgest-src/PREFIX (skipped when the same keys and sizes are there)."""
    from imgest.sources.s3objects import list_objects

    client = settings.client()
    if BUCKET not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket=BUCKET)
    files = {prefix + p.relative_to(root).as_posix(): p for p in root.rglob("*") if p.is_file()}
    files.pop(prefix + ".complete", None)
    there = {o.key: o.size for o in list_objects(client, BUCKET, prefix)}
    if there != {k: p.stat().st_size for k, p in files.items()}:
        for key in there:
            client.delete_object(Bucket=BUCKET, Key=key)
        for key, path in sorted(files.items()):
            client.upload_file(str(path), BUCKET, key)
    return f"s3://{BUCKET}/{prefix}"


def _scan(src: Path | str, out: Path) -> dict[str, Any]:
    from imgest.sources.scan import scan_to_dir

    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    report = scan_to_dir(src, out, "auto", "bench-source")
    seconds = time.perf_counter() - t0
    return {
        "objects": report.candidates,
        "seconds": round(seconds, 3),
        "objects_per_s": round(report.candidates / seconds),
    }


def _ingest(
    manifest_dir: Path, env: dict[str, str], master: str, work: Path, store_pids: list[int]
) -> dict[str, float]:
    """One files job over MANIFEST_DIR: its in-job images/s, the wall time of spark-submit, and the CPU per image
    of the whole machine and of the object store's processes (SeaweedFS, Toxiproxy: STORE_PIDS) meanwhile."""
    from imgest.spark.conf import submit_env
    from imgest.spark.submit import submit_command

    dest, summary = work / "files", work / "summary.json"
    shutil.rmtree(dest, ignore_errors=True)
    args = ["--manifest-dir", str(manifest_dir), "--dest", str(dest), "--summary-json", str(summary)]
    t0, machine0, store0 = time.perf_counter(), busy_seconds(), tree_seconds(store_pids)
    proc = subprocess.run(
        submit_command("write_files", args, master),
        env={**submit_env(master), **env},
        capture_output=True,
        text=True,
        check=False,
    )
    wall, machine, store = (
        time.perf_counter() - t0,
        busy_seconds() - machine0,
        tree_seconds(store_pids) - store0,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"files job on {manifest_dir} failed: {(proc.stdout + proc.stderr)[-2000:]}")
    doc = json.loads(summary.read_text())
    shutil.rmtree(dest, ignore_errors=True)
    images = float(doc["published"])
    return {
        "images_per_s": float(doc["images_per_s"]),
        "wall_s": round(wall, 2),
        "images": images,
        "machine_cpu_ms_per_image": 1000 * machine / images,
        "store_cpu_ms_per_image": 1000 * store / images,
    }


def main(
    json_path: Path,
    images: int = 2000,
    rounds: int = 3,
    rtts: tuple[float, ...] = (0.0, 10.0),
    master: str = "",
    plot_path: Path | None = None,
    layouts: tuple[str, ...] = ("imagefolder", "tar"),
    scan_objects: tuple[int, ...] = (),
) -> dict[str, Any]:
    """Run the benchmark and write JSON_PATH (and the bar chart PLOT_PATH); returns the report.

    SCAN_OBJECTS adds ``scan_main`` for each count. Without LAYOUTS only that runs, and the ingest and scan
    figures of an existing JSON_PATH are kept."""
    import os

    from imgest.services.latency import LatencyProxy
    from imgest.services.s3 import S3Server

    master = master or f"local[{os.cpu_count() or 2}]"
    settings = S3Server.default().settings()
    proxy = LatencyProxy.default()
    proxy.up()
    upstream = (settings.endpoint_url or "").split("://", 1)[-1]
    listen = proxy.proxy(PROXY, env_int("IMGEST_PROXY_S3_SOURCE_PORT", 29334), upstream)
    proxied = replace(settings, endpoint_url=f"http://{listen}")
    rows: list[dict[str, Any]] = []
    scans: list[dict[str, Any]] = []
    store_pids = [pid for pid in (S3Server.default().process.pid(), proxy.process.pid()) if pid is not None]
    with tempfile.TemporaryDirectory(prefix="imgest-bench-source-") as tmp:
        for layout in layouts:
            runs = (rounds, rtts, master, Path(tmp), store_pids)
            layout_rows, layout_scans = _measure_layout(layout, images, settings, proxied, proxy, *runs)
            rows += layout_rows
            scans += layout_scans
    report = {
        "benchmark": "source",
        "what": "files job (jpeg transform) in-job images/s from a local source vs the same dataset on S3 "
        "through Toxiproxy; median of rounds. machine_cpu_ms_per_image: CPU of every process on the machine from "
        "spark-submit to its exit, per image; store_cpu_ms_per_image: the part SeaweedFS and Toxiproxy spent",
        "dataset": _dataset_doc(images),
        "master": master,
        "cores": os.cpu_count(),
        "rounds": rounds,
        "target_ratio": TARGET_RATIO,
        "ingest": rows,
        "scan": scans,
    }
    return _write(report, json_path, plot_path, layouts, scan_objects)


def _measure_layout(
    layout: str,
    images: int,
    settings: S3Settings,
    proxied: S3Settings,
    proxy: Any,
    rounds: int,
    rtts: tuple[float, ...],
    master: str,
    work: Path,
    store_pids: list[int],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One LAYOUT's dataset uploaded to S3, scanned from both places, then ingested from the local copy and from S3
    at each added round trip of RTTS (ROUNDS runs each): its rows and its scans."""
    from imgest.sources.s3source import register_source, source_env

    root = _dataset(layout, images)
    url = _upload(settings, root, f"bench/source/{layout}-{images}/")
    register_source(url, settings)
    local_m, s3_m = work / f"{layout}-local", work / f"{layout}-s3"
    scans = [
        {"layout": layout, "source": "local", **_scan(root, local_m)},
        {"layout": layout, "source": "s3", **_scan(url, s3_m)},
    ]
    conditions: list[tuple[str, float | None, Path, dict[str, str]]] = [("local", None, local_m, {})]
    conditions += [(f"s3 {rtt:g} ms", rtt, s3_m, source_env(proxied)) for rtt in rtts]
    base = None
    rows = []
    for name, rtt, manifest_dir, env in conditions:
        if rtt is not None:
            proxy.set_rtt(PROXY, rtt)
        runs = [_ingest(manifest_dir, env, master, work, store_pids) for _ in range(rounds)]
        rate = statistics.median(r["images_per_s"] for r in runs)
        base = rate if base is None else base
        rows.append(_condition_row(layout, name, rtt, runs, rate, base))
        log.info("%s %s: %.1f images/s (x%.2f of local)", layout, name, rate, rows[-1]["ratio_to_local"])
    proxy.set_rtt(PROXY, 0)
    return rows, scans


def _condition_row(
    layout: str, name: str, rtt: float | None, runs: list[dict[str, Any]], rate: float, base: float
) -> dict[str, Any]:
    """The ingest row of one condition: the median RATE of RUNS, its range, wall time, CPU and ratio to BASE."""
    row = {
        "layout": layout,
        "source": name,
        "rtt_ms": rtt,
        "images": int(runs[0]["images"]),
        "images_per_s": rate,
        "min": min(r["images_per_s"] for r in runs),
        "max": max(r["images_per_s"] for r in runs),
        "wall_s": statistics.median(r["wall_s"] for r in runs),
        "ratio_to_local": round(rate / base, 3),
        "machine_cpu_ms_per_image": round(statistics.median(r["machine_cpu_ms_per_image"] for r in runs), 2),
        "store_cpu_ms_per_image": round(statistics.median(r["store_cpu_ms_per_image"] for r in runs), 2),
    }
    if rtt is not None:
        row["meets_target"] = meets(row["ratio_to_local"], TARGET_RATIO)
    return row


def _write(
    report: dict[str, Any],
    json_path: Path,
    plot_path: Path | None,
    layouts: tuple[str, ...],
    scan_objects: tuple[int, ...],
) -> dict[str, Any]:
    """REPORT with the prefix scans of SCAN_OBJECTS (and, without LAYOUTS, the ingest and scan figures of an
    existing JSON_PATH), written to JSON_PATH, printed, plotted; returns it."""
    if not layouts and json_path.is_file():
        previous = json.loads(json_path.read_text())
        report = {**previous, **{k: v for k, v in report.items() if k not in ("ingest", "scan", "rounds", "dataset")}}
    if scan_objects:
        report["scan_prefix"] = {
            "what": "ImageFolder prefix, 1,000 objects per class folder, each scan in a fresh process; peak RSS is "
            "the process's maximum resident set (ru_maxrss), growth is that minus its RSS once imgest was imported",
            "rows": scan_main(scan_objects),
        }
    write_json(json_path, report)
    _print(report)
    if plot_path is not None:
        plot(report, plot_path)
    return report


def _dataset_doc(images: int) -> dict[str, Any]:
    """What the ImageFolder images of the benchmark are: count, median and mean bytes, most common sizes."""
    from collections import Counter

    from PIL import Image

    files = sorted(_dataset("imagefolder", images).rglob("*.JPEG"))
    sizes = sorted(f.stat().st_size for f in files)
    dims: Counter[str] = Counter()
    for f in files[:: max(1, len(files) // 200)]:
        with Image.open(f) as im:
            dims[f"{im.width}x{im.height}"] += 1
    return {
        "images": len(files),
        "median_bytes": sizes[len(sizes) // 2] if sizes else 0,
        "mean_bytes": round(sum(sizes) / max(1, len(sizes))),
        "common_dimensions": [d for d, _ in dims.most_common(5)],
    }


def plot(report: dict[str, Any], path: Path) -> None:
    """Images/s per layout: the local source beside S3 at each added round trip (the target is 0.9x local)."""
    layouts = list(dict.fromkeys(r["layout"] for r in report["ingest"]))
    sources = list(dict.fromkeys(r["source"] for r in report["ingest"]))
    rate = {(r["layout"], r["source"]): r["images_per_s"] for r in report["ingest"]}
    series = {src: [rate.get((lay, src), 0.0) for lay in layouts] for src in sources}
    title = f"Ingest from S3 vs local ({report['master']}, median of {report['rounds']}; target {TARGET_RATIO}x local)"
    bar_chart(path, title, layouts, series, "images/s (files job, JPEG transform)")


def _print(report: dict[str, Any]) -> None:
    lines = [f"{'layout':<12} {'source':<10} {'images/s':>9} {'x local':>8} {'wall s':>7}"]
    for r in report["ingest"]:
        rate, ratio = f"{r['images_per_s']:>9.1f}", f"{r['ratio_to_local']:>8.2f}"
        lines.append(f"{r['layout']:<12} {r['source']:<10} {rate} {ratio} {r['wall_s']:>7.1f}")
    for s in report["scan"] + report.get("scan_prefix", {}).get("rows", []):
        line = f"scan {s['layout']:<12} {s['source']:<6} {s['objects']:>6} objects {s['objects_per_s']:>8}/s"
        lines.append(line + (f", peak RSS {s['peak_rss_mib']:.0f} MiB" if "peak_rss_mib" in s else ""))
    log.info("source benchmark:\n%s", "\n".join(lines))
