"""The tools `imgest bench pack` compares imgest with: webdataset's ShardWriter, LitData's optimize and GNU tar,
each on the same files (with a natural transform or imgest's)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from imgest.bench.pack_data import SPEC, manifest_files
from imgest.bench.transform_speed import baseline_transform

PEER_TRANSFORMS = ("natural", "imgest")  # what a user of the tool would write / imgest's transform


def peer_items(manifest: Path, seed: int = 0) -> list[tuple[str, int, str]]:
    """(path, label, key) of every row in one seeded order, the same for every peer."""
    import random

    root, files = manifest_files(manifest)
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
    items = peer_items(manifest)
    t0 = time.perf_counter()
    optimize(
        fn=_litdata_natural if transform == "natural" else _litdata_imgest,
        inputs=items,
        output_dir=str(out / "litdata"),
        chunk_bytes="64MB",
        num_workers=workers,
        mode="overwrite",
    )
    wall = time.perf_counter() - t0
    # a worker that dies is only printed by LitData, which then finishes: its time is of no work
    chunks = json.loads((out / "litdata" / "index.json").read_text())["chunks"]
    if sum(c["chunk_size"] for c in chunks) != len(items):
        raise RuntimeError(f"litdata.optimize wrote {sum(c['chunk_size'] for c in chunks)} of {len(items)} samples")
    size = sum(p.stat().st_size for p in (out / "litdata").rglob("*") if p.is_file())
    return {"wall_s": wall, "in_job_s": wall, "bytes": size}


def run_tar(manifest: Path, out: Path) -> dict[str, float]:
    """GNU tar of the same source files (the UNCHANGED baseline)."""
    root, files = manifest_files(manifest)
    out.mkdir(parents=True, exist_ok=True)
    listing = out / "files.txt"
    listing.write_text("".join(rel + "\n" for rel, _ in files))
    t0 = time.perf_counter()
    # --hard-dereference: the larger bench datasets are hard links to the base images; archive their data
    tar = ["tar", "--hard-dereference", "-cf", str(out / "plain.tar"), "-C", str(root), "-T", str(listing)]
    subprocess.run(tar, check=True)
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "in_job_s": wall, "bytes": (out / "plain.tar").stat().st_size}
