#!/usr/bin/env python3
"""Read-back check of the DALI pipelines on CPU and on a GPU (``mixed`` decoding), with no services.

Needs no Cassandra, S3 or Spark: it generates a small photo-like dataset with the project's own generator
(``imgest.sinks.files.sample``: the files target's published layout), packs the same images into
webdataset shards with the project's shard writer (``ShardTarWriter`` and ``LocalStore``: tar, DALI index,
``samples.parquet``, ``manifest.json``), and then runs the project's read-back checks over both
(``files_runs``: ``fn.readers.file``; ``folder_shard_runs``: ``fn.readers.webdataset``) in raw and train mode,
with ``device_id=None`` (CPU decoding) and ``device_id=0`` (``fn.decoders.image_random_crop`` with the
``mixed`` decoder). Every run must read every image exactly once with its recorded sha256 and label; GPU runs
must report ``device == "gpu"``. It also decodes one batch with a plain ``fn.decoders.image`` on CPU and with
``mixed`` on the GPU and compares the pixels (mean absolute difference, in 8-bit levels).

It prints a table and writes a JSON report (images/s of each reader on CPU and GPU, batch size, threads,
DALI version, GPU name, pixel difference) to ``--json``. Exit status: 0 when everything matched, 1 on any
mismatch, 2 when no GPU is visible (without ``--cpu-only``).

    python scripts/gpu_readback_check.py --json gpu-readback.json            # CPU and GPU
    python scripts/gpu_readback_check.py --cpu-only --json /tmp/x.json       # CPU half only (no GPU)
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout, installed or not
    sys.path.insert(0, str(ROOT))

SPLIT = "train"
PIXEL_LIMIT = 2.0  # mean absolute difference (8-bit levels) allowed between CPU and GPU decoding of one image


@dataclass(frozen=True)
class Config:
    """What one check generates and how it reads."""

    work: Path
    classes: int
    per_class: int
    large_every: int
    shard_count: int
    batch_size: int
    threads: int
    repeats: int
    seed: int
    gpu: bool


def make_files(cfg: Config) -> Path:
    """The generated dataset in the files target's published layout (<split>/<wnid>/<id>.jpg, manifest last)."""
    from imgest.sinks.files.sample import write_files_dataset

    root = cfg.work / "files"
    write_files_dataset(
        root, classes=cfg.classes, per_class=cfg.per_class, val_per_class=1, seed=cfg.seed, large_every=cfg.large_every
    )
    return root


def shard_members(item: Any, data: bytes) -> list[tuple[str, bytes]]:
    """The webdataset members of one stored file, exactly as the shard job writes them (sample_members)."""
    from PIL import Image

    from imgest.sinks.shards.pack import sample_members
    from imgest.sources.manifest import Candidate

    width, height = Image.open(io.BytesIO(data)).size
    cand = Candidate(item.id, item.split, item.path, item.wnid, item.label, len(data), 0.0)
    return sample_members(cand, data, "jpg", width, height)


def make_shards(files_root: Path, cfg: Config) -> Path:
    """The same train images as published webdataset shards in a folder (tar + .idx, samples.parquet, manifest)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from imgest.core import workdir
    from imgest.sinks.files.layout import data_root, iter_files
    from imgest.sinks.shards.store import LocalStore
    from imgest.sinks.shards.tar_writer import ShardTarWriter

    root = cfg.work / "shards"
    store = LocalStore(root)
    items = list(iter_files(files_root, SPLIT))
    folder = data_root(files_root)  # the version folder the files dataset's manifest names
    entries: list[dict[str, Any]] = []
    samples: dict[str, list[Any]] = {"id": [], "label": [], "split": [], "shard": [], "position": []}
    scratch = cfg.work / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    for start in range(0, len(items), cfg.shard_count):
        name = f"{SPLIT}-{start // cfg.shard_count:06d}.tar"
        group = items[start : start + cfg.shard_count]
        with ShardTarWriter(scratch / name) as writer:
            for pos, item in enumerate(group):
                writer.add(item.id, shard_members(item, (folder / item.path).read_bytes()))
                for column, value in zip(samples, (item.id, item.label, SPLIT, name, pos), strict=True):
                    samples[column].append(value)
        shard = writer.result
        assert shard is not None
        index = workdir.shard_index(name)
        (scratch / index).write_text(shard.index)
        store.put_file(scratch / index, index, {"bytes": str(len(shard.index.encode())), "samples": "0"})
        meta = {"sha256": shard.sha256, "bytes": str(shard.nbytes), "samples": str(shard.samples)}
        store.put_file(shard.path, name, meta)
        entries.append(
            {
                "name": name,
                "split": SPLIT,
                "samples": shard.samples,
                "bytes": shard.nbytes,
                "sha256": shard.sha256,
                "index": index,
            }
        )
    buf = io.BytesIO()
    pq.write_table(pa.table(samples), buf)
    store.put_bytes(workdir.PUBLISHED_SAMPLES, buf.getvalue())
    store.write_manifest(
        {
            "format": "webdataset",
            "dataset": "gpu-readback",
            "shards": entries,
            "samples": {SPLIT: len(items)},
            "bytes": sum(e["bytes"] for e in entries),
        }
    )
    return root


def generate(cfg: Config) -> tuple[Path, Path, bool]:
    """(files root, shards root, reused): the generated dataset under cfg.work, made once per generation settings
    (a finished earlier generation in the same --work folder with the same settings is reused)."""
    settings = {k: getattr(cfg, k) for k in ("classes", "per_class", "large_every", "shard_count", "seed")}
    done = cfg.work / "generated.json"
    files_root, shards_root = cfg.work / "files", cfg.work / "shards"
    if done.is_file() and json.loads(done.read_text()) == settings:
        return files_root, shards_root, True
    files_root = make_files(cfg)
    shards_root = make_shards(files_root, cfg)
    done.write_text(json.dumps(settings, sort_keys=True))  # last: its presence means both targets are complete
    return files_root, shards_root, False


def read_runs(files_root: Path, shards_root: Path, cfg: Config, device_id: int | None) -> list[dict[str, Any]]:
    """The project's files and shards-folder checks (raw and train), REPEATS times each (the first warms up)."""
    from imgest.readback.check import ReadCheckOptions, files_runs, folder_shard_runs
    from imgest.readback.datasets import files_set, shards_set
    from imgest.sinks.shards.store import open_store

    opts = ReadCheckOptions(
        batch_size=cfg.batch_size, modes=("raw", "train"), num_threads=cfg.threads, device_id=device_id
    )
    files = files_set(files_root, SPLIT)
    shards = shards_set(open_store(str(shards_root)), SPLIT)
    out: list[dict[str, Any]] = []
    for repeat in range(cfg.repeats):
        for result in files_runs(files, opts) + folder_shard_runs(shards, str(shards_root), opts):
            out.append({**result.to_dict(), "repeat": repeat, "expected_images": len(files)})
    return out


def run_problems(runs: list[dict[str, Any]], device: str) -> list[str]:
    """What is wrong with RUNS: a failed verification, a wrong count or a wrong device."""
    problems = []
    for r in runs:
        where = f"{r['reader']} {r['mode']} {device} repeat {r['repeat']}"
        if not r["ok"]:
            problems.append(f"{where}: {'; '.join(r['problems'][:5])}")
        if r["images"] != r["expected_images"]:
            problems.append(f"{where}: read {r['images']} images, expected {r['expected_images']}")
        if r["device"] != device:
            problems.append(f"{where}: reports device {r['device']!r}")
    return problems


def pixel_check(paths: list[str], cfg: Config) -> dict[str, Any]:
    """Decode one batch with fn.decoders.image on CPU and with ``mixed`` on GPU 0; compare the pixels."""
    from nvidia.dali import Pipeline, fn, types

    paths = paths[: cfg.batch_size]
    decoded: dict[str, list[np.ndarray]] = {}
    for device in ("cpu", "mixed"):
        pipe = Pipeline(batch_size=len(paths), num_threads=cfg.threads, device_id=0, seed=cfg.seed)
        with pipe:
            jpegs, _ = fn.readers.file(files=paths, random_shuffle=False)
            pipe.set_outputs(fn.decoders.image(jpegs, device=device, output_type=types.RGB))
        pipe.build()
        (images,) = pipe.run()
        if device == "mixed":
            images = images.as_cpu()
        decoded[device] = [np.array(images.at(i)) for i in range(len(paths))]
    diffs, shape_mismatch = [], []
    for path, cpu, gpu in zip(paths, decoded["cpu"], decoded["mixed"], strict=True):
        if cpu.shape != gpu.shape:
            shape_mismatch.append(f"{Path(path).name}: cpu {cpu.shape}, gpu {gpu.shape}")
            continue
        diffs.append(np.abs(cpu.astype(np.int16) - gpu.astype(np.int16)))
    means = [float(d.mean()) for d in diffs]
    return {
        "images": len(paths),
        "mean_abs_diff": round(float(np.mean(means)), 4) if means else None,
        "worst_image_mean_abs_diff": round(max(means), 4) if means else None,
        "max_abs_diff": int(max(int(d.max()) for d in diffs)) if diffs else None,
        "identical_pixels": round(float(np.mean([float((d == 0).mean()) for d in diffs])), 4) if diffs else None,
        "shape_mismatch": shape_mismatch,
        "limit": PIXEL_LIMIT,
    }


def gpu_name() -> dict[str, str]:
    """GPU name and driver from nvidia-smi (empty when it is missing)."""
    try:
        line = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return {}
    name, driver, memory = (p.strip() for p in line.split(","))
    return {"name": name, "driver": driver, "memory": memory}


def best(runs: list[dict[str, Any]], reader: str, mode: str) -> dict[str, Any] | None:
    """The fastest run of READER in MODE after the first repeat (the warm-up), or the only one."""
    found = [r for r in runs if r["reader"] == reader and r["mode"] == mode]
    steady = [r for r in found if r["repeat"] > 0] or found
    return max(steady, key=lambda r: r["images_per_s"]) if steady else None


def summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """reader -> mode -> {cpu, gpu, gpu_over_cpu} images/s (best steady run of each)."""
    out: dict[str, Any] = {}
    for reader in ("files", "shards-folder"):
        for mode in ("raw", "train"):
            row: dict[str, Any] = {}
            for device, found in runs.items():
                b = best(found, reader, mode)
                row[device] = b["images_per_s"] if b else None
                row[f"{device}_mb_per_s"] = b["mb_per_s"] if b else None
                row[f"{device}_cpu_cores"] = b["cpu_cores"] if b else None
            if row.get("cpu") and row.get("gpu"):
                row["gpu_over_cpu"] = round(row["gpu"] / row["cpu"], 2)
            out.setdefault(reader, {})[mode] = row
    return out


def print_table(runs: dict[str, list[dict[str, Any]]], table: dict[str, Any]) -> None:
    header = f"{'reader':<14} {'mode':<6} {'device':<6} {'rep':>3} {'images':>6} {'img/s':>9} {'MB/s':>8}"
    header += f" {'p50 ms':>8} {'p99 ms':>8} {'cores':>6} ok"
    print(header)
    for found in runs.values():
        for r in found:
            print(
                f"{r['reader']:<14} {r['mode']:<6} {r['device']:<6} {r['repeat']:>3} {r['images']:>6} "
                f"{r['images_per_s']:>9.1f} {r['mb_per_s']:>8.2f} {r['batch_ms_p50']:>8.2f} {r['batch_ms_p99']:>8.2f} "
                f"{r['cpu_cores']:>6.2f} {'yes' if r['ok'] else 'NO'}"
            )
    print("\nimages/s, best steady run (train = decode + random resized crop + flip + normalize):")
    for reader, modes in table.items():
        for mode, row in modes.items():
            ratio = f"  gpu/cpu {row['gpu_over_cpu']:.2f}x" if "gpu_over_cpu" in row else ""
            print(f"  {reader:<14} {mode:<6} cpu {row.get('cpu')}  gpu {row.get('gpu')}{ratio}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, type=Path, help="write the report here")
    parser.add_argument("--cpu-only", action="store_true", help="CPU runs only (no GPU needed)")
    parser.add_argument("--work", type=Path, help="folder for the generated data, kept and reused (default: temporary)")
    parser.add_argument("--generate-only", action="store_true", help="generate the data into --work, then stop")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--per-class", type=int, help="train images per class (default 100; 6 with --cpu-only)")
    parser.add_argument("--large-every", type=int, default=40, help="every Nth image is a multi-megapixel photo")
    parser.add_argument("--shard-count", type=int, default=128, help="samples per shard")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, help="DALI CPU threads (default: min(8, CPUs))")
    parser.add_argument("--repeats", type=int, default=3, help="epochs per reader and mode; the first warms up")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.generate_only and not args.work:
        parser.error("--generate-only needs --work")
    with tempfile.TemporaryDirectory(prefix="gpu-readback-") as tmp:
        cfg = Config(
            work=args.work or Path(tmp),
            classes=args.classes,
            per_class=args.per_class or (6 if args.cpu_only else 100),
            large_every=args.large_every,
            shard_count=args.shard_count,
            batch_size=args.batch_size,
            threads=args.threads or min(8, os.cpu_count() or 1),
            repeats=max(1, args.repeats),
            seed=args.seed,
            gpu=not args.cpu_only,
        )
        t0 = time.perf_counter()
        files_root, shards_root, reused = generate(cfg)
        generated_s = time.perf_counter() - t0
        print(f"dataset {'reused' if reused else 'generated'} under {cfg.work} in {generated_s:.1f} s", flush=True)
        if args.generate_only:
            return 0
        import nvidia.dali

        from imgest.readback.pipelines import cuda_devices

        gpus = 0 if args.cpu_only else cuda_devices()
        if not args.cpu_only and gpus == 0:
            print("no CUDA device visible to DALI; use --cpu-only for the CPU half", file=sys.stderr)
            return 2
        runs = {"cpu": read_runs(files_root, shards_root, cfg, None)}
        problems = run_problems(runs["cpu"], "cpu")
        pixels: dict[str, Any] | None = None
        if cfg.gpu:
            runs["gpu"] = read_runs(files_root, shards_root, cfg, 0)
            problems += run_problems(runs["gpu"], "gpu")
            from imgest.readback.datasets import files_set

            pixels = pixel_check(files_set(files_root, SPLIT).paths, cfg)
            if pixels["shape_mismatch"]:
                problems.append(f"pixel check: shapes differ: {pixels['shape_mismatch'][:3]}")
            if pixels["mean_abs_diff"] is None or pixels["worst_image_mean_abs_diff"] > PIXEL_LIMIT:
                problems.append(f"pixel check: mean abs difference over {PIXEL_LIMIT} levels: {pixels}")
        dataset_bytes = sum(p.stat().st_size for p in (files_root / SPLIT).rglob("*.jpg"))
    table = summary(runs)
    print_table(runs, table)
    if pixels:
        print(
            f"\npixels, fn.decoders.image cpu vs mixed over {pixels['images']} images: mean abs diff "
            f"{pixels['mean_abs_diff']} levels (worst image {pixels['worst_image_mean_abs_diff']}, max "
            f"{pixels['max_abs_diff']}, identical {pixels['identical_pixels']:.1%})"
        )
    report = {
        "ok": not problems,
        "problems": problems,
        "dali_version": nvidia.dali.__version__,
        "gpu": gpu_name() if cfg.gpu else {},
        "cuda_devices": gpus,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items() if k != "work"},
        "dataset": {"train_images": cfg.classes * cfg.per_class, "train_bytes": dataset_bytes},
        "generate_seconds": round(generated_s, 2),
        "dataset_reused": reused,
        "images_per_s": table,
        "pixel_check": pixels,
        "runs": [r for found in runs.values() for r in found],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    print(f"\n{'OK' if not problems else 'FAILED'}: report in {args.json}")
    for p in problems:
        print(f"  {p}", file=sys.stderr)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
