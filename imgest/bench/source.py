"""`imgest bench source`: ingest images/s from a local source vs the same dataset on S3, 0 ms and added RTT.

Same generated dataset per layout (ImageFolder folders, ImageNet's tar of class tars + val tar), same job (the
files target's Spark job on ``local[N]``), same cores, same transform. The S3 source lives in the embedded
SeaweedFS and is read through a Toxiproxy proxy that adds each RTT in turn (0 ms: the proxy alone). Figures are
the job's own in-job images/s (Spark's start-up excluded) and the spark-submit wall time, median of ROUNDS, and
the ratio to the local source of the same layout. The scan is timed too (objects/s of listing or tar indexing).
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

from imgest.core.paths import state_dir
from imgest.core.settings import S3Settings, env_int

log = logging.getLogger(__name__)

BUCKET = "imgest-src"
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


def _ingest(manifest_dir: Path, env: dict[str, str], master: str, work: Path) -> dict[str, float]:
    """One files job over MANIFEST_DIR; its in-job images/s and the wall time of spark-submit."""
    from imgest.spark.submit import submit_command, submit_env

    dest, summary = work / "files", work / "summary.json"
    shutil.rmtree(dest, ignore_errors=True)
    args = ["--manifest-dir", str(manifest_dir), "--dest", str(dest), "--summary-json", str(summary)]
    t0 = time.perf_counter()
    proc = subprocess.run(
        submit_command("write_files", args, master),
        env={**submit_env(master), **env},
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"files job on {manifest_dir} failed: {(proc.stdout + proc.stderr)[-2000:]}")
    doc = json.loads(summary.read_text())
    shutil.rmtree(dest, ignore_errors=True)
    return {"images_per_s": float(doc["images_per_s"]), "wall_s": round(wall, 2), "images": float(doc["published"])}


def main(
    json_path: Path,
    images: int = 2000,
    rounds: int = 3,
    rtts: tuple[float, ...] = (0.0, 10.0),
    master: str = "",
    plot_path: Path | None = None,
) -> dict[str, Any]:
    """Run the benchmark and write JSON_PATH (and the bar chart PLOT_PATH); returns the report."""
    import os

    from imgest.services.latency import LatencyProxy
    from imgest.services.s3 import S3Server
    from imgest.sources.s3objects import register_source, source_env

    master = master or f"local[{os.cpu_count() or 2}]"
    settings = S3Server.default().settings()
    proxy = LatencyProxy.default()
    proxy.up()
    upstream = (settings.endpoint_url or "").split("://", 1)[-1]
    listen = proxy.proxy(PROXY, env_int("IMGEST_PROXY_S3_SOURCE_PORT", 29334), upstream)
    proxied = replace(settings, endpoint_url=f"http://{listen}")
    rows: list[dict[str, Any]] = []
    scans: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="imgest-bench-source-") as tmp:
        work = Path(tmp)
        for layout in ("imagefolder", "tar"):
            root = _dataset(layout, images)
            url = _upload(settings, root, f"bench/source/{layout}-{images}/")
            register_source(url, settings)
            local_m, s3_m = work / f"{layout}-local", work / f"{layout}-s3"
            scans += [
                {"layout": layout, "source": "local", **_scan(root, local_m)},
                {"layout": layout, "source": "s3", **_scan(url, s3_m)},
            ]
            conditions: list[tuple[str, float | None, Path, dict[str, str]]] = [("local", None, local_m, {})]
            conditions += [(f"s3 {rtt:g} ms", rtt, s3_m, source_env(proxied)) for rtt in rtts]
            base = None
            for name, rtt, manifest_dir, env in conditions:
                if rtt is not None:
                    proxy.set_rtt(PROXY, rtt)
                runs = [_ingest(manifest_dir, env, master, work) for _ in range(rounds)]
                rate = statistics.median(r["images_per_s"] for r in runs)
                base = rate if base is None else base
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
                }
                if rtt is not None:
                    row["meets_target"] = row["ratio_to_local"] >= TARGET_RATIO
                rows.append(row)
                log.info("%s %s: %.1f images/s (x%.2f of local)", layout, name, rate, row["ratio_to_local"])
            proxy.set_rtt(PROXY, 0)
    report = {
        "benchmark": "source",
        "what": "files job (jpeg transform) in-job images/s from a local source vs the same dataset on S3 "
        "through Toxiproxy; median of rounds",
        "master": master,
        "cores": os.cpu_count(),
        "rounds": rounds,
        "target_ratio": TARGET_RATIO,
        "ingest": rows,
        "scan": scans,
    }
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    _print(report)
    if plot_path is not None:
        plot(report, plot_path)
    return report


def plot(report: dict[str, Any], path: Path) -> None:
    """Images/s per layout: the local source beside S3 at each added round trip (the target is 0.9x local)."""
    from imgest.bench.report import bar_chart

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
    for s in report["scan"]:
        lines.append(f"scan {s['layout']:<12} {s['source']:<6} {s['objects']:>6} objects {s['objects_per_s']:>8}/s")
    log.info("source benchmark:\n%s", "\n".join(lines))
