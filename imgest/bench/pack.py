"""`imgest bench pack`: imgest's shard job against webdataset's ShardWriter and LitData's optimize.

All three read the same generated dataset and write the same members (.jpg, .cls, .json) in one seeded
order, with as many processes as Spark has cores (local[*]): webdataset's ShardWriter in a process pool
(one writer per process, each on a contiguous slice), LitData with that many workers. The peers run twice:
with the plain Pillow pipeline their users would write ("natural") and with imgest's transform (the
packing systems alone). imgest runs its real Spark
job (spark-submit, local master), so its wall time includes starting the JVM and the Spark session, and
its in-job time is reported beside it. UNCHANGED mode is compared with a plain ``tar`` of the same files.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from imgest.bench.report import bar_chart, format_table, machine_info, write_json
from imgest.bench.transform import baseline_transform
from imgest.core import workdir
from imgest.core.paths import state_dir
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.manifest import iter_manifest, manifest_metadata
from imgest.sources.scan import scan_to_dir
from imgest.spark.submit import submit_command, submit_env
from imgest.transform.image import TransformSpec

SPEC = TransformSpec()


def dataset(images: int) -> Path:
    """A generated ImageFolder dataset of about IMAGES train images, scanned; cached in the state folder."""
    classes = 10
    root = state_dir() / "bench" / f"pack-{images}"
    manifest = root / "manifest"
    if not (manifest / workdir.MANIFEST).is_file():
        write_sample(root / "src", SampleSpec("imagefolder", classes, max(1, images // classes), 0, seed=1))
        scan_to_dir(root / "src", manifest)
    return manifest


def _files(manifest: Path) -> tuple[Path, list[tuple[str, int]]]:
    root = Path(manifest_metadata(manifest / workdir.MANIFEST)["root"])
    return root, [(c.rel_path, c.label) for c in iter_manifest(manifest / workdir.MANIFEST)]


def run_imgest(manifest: Path, out: Path, mode: str, max_count: int) -> dict[str, float]:
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


PEER_TRANSFORMS = ("natural", "imgest")  # what a user of the tool would write / imgest's transform


def peer_items(manifest: Path, seed: int = 0) -> list[tuple[str, int, str]]:
    """(path, label, key) of every row in one seeded order, the same for every peer."""
    import random

    root, files = _files(manifest)
    items = [(str(root / rel), label, f"s{i:08d}") for i, (rel, label) in enumerate(files)]
    random.Random(seed).shuffle(items)
    return items


def peer_sample(item: tuple[str, int, str], transform: str) -> dict[str, Any]:
    """The members imgest writes (.jpg, .cls, .json), made with the plain Pillow or imgest's transform."""
    import hashlib

    from imgest.transform.image import transform_image

    path, label, key = item
    data = Path(path).read_bytes()
    jpg = baseline_transform(data, SPEC) if transform == "natural" else transform_image(data, SPEC).data
    meta = {"label": label, "source": path, "sha256": hashlib.sha256(jpg).hexdigest()}
    return {"__key__": key, "jpg": jpg, "cls": str(label).encode(), "json": json.dumps(meta, sort_keys=True).encode()}


def _shardwriter_slice(out: str, part: int, items: list[tuple[str, int, str]], transform: str, max_count: int) -> int:
    import webdataset as wds

    with wds.ShardWriter(f"{out}/part{part:02d}-%06d.tar", maxcount=max_count, verbose=0) as sink:
        for item in items:
            sink.write(peer_sample(item, transform))
    return len(items)


def run_shardwriter(manifest: Path, out: Path, max_count: int, transform: str, workers: int) -> dict[str, float]:
    """webdataset.ShardWriter in a pool of WORKERS processes, each writing its contiguous slice of the order."""
    from concurrent.futures import ProcessPoolExecutor

    items = peer_items(manifest)
    (out / "wds").mkdir(parents=True, exist_ok=True)
    step = -(-len(items) // workers)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        done = pool.map(
            _shardwriter_slice,
            [str(out / "wds")] * workers,
            range(workers),
            [items[i * step : (i + 1) * step] for i in range(workers)],
            [transform] * workers,
            [max_count] * workers,
        )
        assert sum(done) == len(items)
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "in_job_s": wall, "bytes": sum(p.stat().st_size for p in (out / "wds").iterdir())}


def _litdata_natural(item: tuple[str, int, str]) -> dict[str, Any]:
    return peer_sample(item, "natural")


def _litdata_imgest(item: tuple[str, int, str]) -> dict[str, Any]:
    return peer_sample(item, "imgest")


def run_litdata(manifest: Path, out: Path, transform: str, workers: int) -> dict[str, float] | None:
    """litdata.optimize with WORKERS processes, or None when LitData is not installed (extra 'bench')."""
    try:
        from litdata import optimize
    except ImportError:
        return None
    t0 = time.perf_counter()
    optimize(
        fn=_litdata_natural if transform == "natural" else _litdata_imgest,
        inputs=peer_items(manifest),
        output_dir=str(out / "litdata"),
        chunk_bytes="64MB",
        num_workers=workers,
        mode="overwrite",
    )
    wall = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in (out / "litdata").rglob("*") if p.is_file())
    return {"wall_s": wall, "in_job_s": wall, "bytes": size}


def run_tar(manifest: Path, out: Path) -> dict[str, float]:
    """GNU tar of the same source files (the UNCHANGED baseline)."""
    root, files = _files(manifest)
    out.mkdir(parents=True, exist_ok=True)
    listing = out / "files.txt"
    listing.write_text("".join(rel + "\n" for rel, _ in files))
    t0 = time.perf_counter()
    subprocess.run(["tar", "-cf", str(out / "plain.tar"), "-C", str(root), "-T", str(listing)], check=True)
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "in_job_s": wall, "bytes": (out / "plain.tar").stat().st_size}


def run(images: int, max_count: int) -> dict[str, Any]:
    manifest = dataset(images)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="imgest-bench-pack-") as tmp:
        work = Path(tmp)
        cores = os.cpu_count() or 1  # local[*] runs one Spark task per core; each peer gets as many processes
        results: dict[str, dict[str, float] | None] = {
            "imgest (Spark, local[*])": run_imgest(manifest, work / "imgest", "jpeg", max_count)
        }
        for tf in PEER_TRANSFORMS:
            results[f"webdataset ShardWriter ({cores} processes, {tf} transform)"] = run_shardwriter(
                manifest, work / f"sw-{tf}", max_count, tf, cores
            )
            results[f"LitData optimize ({cores} workers, {tf} transform)"] = run_litdata(
                manifest, work / f"ld-{tf}", tf, cores
            )
        peers = [r["wall_s"] for name, r in results.items() if r is not None and not name.startswith("imgest")]
        fastest_peer = min(peers)
        for name, r in results.items():
            if r is None:
                rows.append({"tool": name, "mode": "jpeg", "note": "not installed: pip install 'imgest[bench]'"})
                continue
            rows.append(
                {
                    "tool": name,
                    "mode": "jpeg",
                    "wall_s": round(r["wall_s"], 2),
                    "in_job_s": round(r["in_job_s"], 2),
                    "vs_fastest_peer": round(r["wall_s"] / fastest_peer, 2),
                    "mb": round(r["bytes"] / 1e6, 1),
                }
            )
        unchanged = run_imgest(manifest, work / "imgest-u", "unchanged", max_count)
        plain = run_tar(manifest, work / "tar")
        for name, r in (("imgest (Spark, unchanged)", unchanged), ("GNU tar of the files", plain)):
            rows.append(
                {
                    "tool": name,
                    "mode": "unchanged",
                    "wall_s": round(r["wall_s"], 2),
                    "in_job_s": round(r["in_job_s"], 2),
                    "mb": round(r["bytes"] / 1e6, 1),
                    "mb_per_s": round(r["bytes"] / 1e6 / r["wall_s"], 1),
                }
            )
        shutil.rmtree(work, ignore_errors=True)
    imgest_row = rows[0]
    return {
        "benchmark": "pack",
        "images": sum(1 for _ in iter_manifest(manifest / workdir.MANIFEST)),
        "max_count": max_count,
        "cores": os.cpu_count(),
        "target_vs_fastest_peer": 0.5,
        "meets_target": imgest_row.get("vs_fastest_peer", 99) <= 0.5,
        "machine": machine_info(),
        "rows": rows,
    }


COLUMNS = [
    ("tool", "tool"),
    ("mode", "mode"),
    ("wall_s", "wall s"),
    ("in_job_s", "in-job s"),
    ("vs_fastest_peer", "x fastest peer"),
    ("mb", "MB out"),
    ("mb_per_s", "MB/s"),
    ("note", ""),
]


def main(json_out: Path, plot: Path | None, images: int, max_count: int) -> dict[str, Any]:
    report = run(images, max_count)
    print(f"{report['images']} images, {report['cores']} cores")
    print(format_table(report["rows"], COLUMNS))
    write_json(json_out, report)
    if plot is not None:
        shown = [r for r in report["rows"] if "wall_s" in r]
        bar_chart(
            plot,
            f"Packing {report['images']} images into shards (wall time, lower is better)",
            [r["tool"].replace(" (", "\n(") for r in shown],
            {"wall s": [r["wall_s"] for r in shown]},
            "seconds",
        )
    return report
