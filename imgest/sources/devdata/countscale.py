"""ImageNet at its real count, in small files: the dataset `imgest bench scale` measures every step on.

ImageNet-1k's CLS-LOC layout with 1,000 classes, 1,281,167 train and 50,000 val images (labels in
`LOC_val_solution.csv`), each a small distinct JPEG (64x48 by default, about 1 KB), so the whole count fits this
machine (about 1.4 GB). Per-class train counts follow ImageNet's shape: most classes hold 1,300 images, the
rest fewer. Generated once per spec and cached; fractions (1 %, 10 %) are hard-linked subsets of the same
files, so every size shares the bytes and differs only in count.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from imgest.sources.devdata.sample import synsets

log = logging.getLogger(__name__)

POOL = "_pool"  # the distinct photo-like images of a byte-scale tree
SPEC_FILE = "count-scale.json"  # written last: its presence with the same spec means the tree is complete
CLS_LOC = Path("ILSVRC") / "Data" / "CLS-LOC"


@dataclass(frozen=True)
class CountScaleSpec:
    """What to generate: ImageNet-1k's counts by default."""

    classes: int = 1000
    train: int = 1_281_167
    val: int = 50_000
    width: int = 64
    height: int = 48
    seed: int = 0
    photo: int = 0  # > 0: ImageNet-size photo-like images, this many distinct ones hard-linked to every path


# ImageNet's bytes at a count this machine holds: 100,000 ImageNet-size images (about 110 KB each).
BYTE_SCALE = CountScaleSpec(classes=100, train=95_000, val=5_000, photo=2_000)


def train_counts(spec: CountScaleSpec) -> np.ndarray:
    """Train images per class: ImageNet's shape (most classes at the 1,300 cap, the rest fewer), summing to TRAIN."""
    cap = max(1, math.ceil(spec.train / spec.classes * 1300 / 1281.167))
    counts = np.full(spec.classes, cap, dtype=np.int64)
    deficit = int(counts.sum()) - spec.train
    short = np.random.default_rng([spec.seed, 3]).permutation(spec.classes)[: max(1, spec.classes // 9)]
    counts[short] -= deficit // len(short)  # about 11 % of ImageNet's classes hold fewer than 1,300 images
    counts[short[: deficit % len(short)]] -= 1
    if counts.min() < 1:
        raise ValueError(f"{spec.train} train images cannot fill {spec.classes} classes in ImageNet's shape")
    return counts


def val_classes(spec: CountScaleSpec) -> np.ndarray:
    """The class of each val image (ILSVRC2012_val_00000001 first): SPEC.val / classes each, in a seeded order."""
    per = np.repeat(np.arange(spec.classes), math.ceil(spec.val / spec.classes))[: spec.val]
    return np.random.default_rng([spec.seed, 5]).permutation(per)


def _jpeg(rng: np.random.Generator, spec: CountScaleSpec) -> bytes:
    from PIL import Image

    field = (rng.random((3, 4, 3)) * 255).astype(np.uint8)
    img = Image.fromarray(field).resize((spec.width, spec.height), Image.Resampling.BILINEAR)
    out = io.BytesIO()
    img.save(out, "JPEG", quality=85)
    return out.getvalue()


def distinct_jpeg(spec: CountScaleSpec, key: int) -> bytes:
    """An image of SPEC's kind (small, or ImageNet-size when SPEC.photo) that no generated path holds, seeded by KEY:
    what a refresh benchmark writes over a changed or added file."""
    rng = np.random.default_rng([spec.seed, 11, key])
    if spec.photo:
        from imgest.sources.devdata.images import jpeg_bytes

        return jpeg_bytes(rng, rng.random(3), large=False)
    return _jpeg(rng, spec)


def _write_pool(root: str, spec: CountScaleSpec, first: int, last: int) -> int:
    """Photo-like ImageNet-size images FIRST..LAST-1 of the pool; returns bytes written."""
    from imgest.sources.devdata.images import jpeg_bytes

    written = 0
    for k in range(first, last):
        rng = np.random.default_rng([spec.seed, 9, k])
        data = jpeg_bytes(rng, rng.random(3), large=False)
        (Path(root) / POOL / f"{k:06d}.JPEG").write_bytes(data)
        written += len(data)
    return written


def _put(root: Path, spec: CountScaleSpec, rng: np.random.Generator, key: int, path: Path) -> int:
    if not spec.photo:
        data = _jpeg(rng, spec)
        path.write_bytes(data)
        return len(data)
    pooled = root / POOL / f"{key * 7919 % spec.photo:06d}.JPEG"
    _link(pooled, path)
    return pooled.stat().st_size


def _write_classes(root: str, spec: CountScaleSpec, first: int, last: int) -> int:
    """Write train images of classes FIRST..LAST-1 and their val images; returns bytes written."""
    counts, wnids, vcls = train_counts(spec), [w for w, _ in synsets(spec.classes)], val_classes(spec)
    base, written = Path(root) / CLS_LOC, 0
    for cls in range(first, last):
        rng = np.random.default_rng([spec.seed, 1, cls])
        folder = base / "train" / wnids[cls]
        folder.mkdir(parents=True, exist_ok=True)
        for n in range(int(counts[cls])):
            written += _put(Path(root), spec, rng, cls * 1301 + n, folder / f"{wnids[cls]}_{n + 1}.JPEG")
        vrng = np.random.default_rng([spec.seed, 2, cls])
        for index in np.flatnonzero(vcls == cls):
            name = f"ILSVRC2012_val_{index + 1:08d}.JPEG"
            written += _put(Path(root), spec, vrng, 3_000_000 + int(index), base / "val" / name)
    return written


def write_count_scale(root: Path, spec: CountScaleSpec = CountScaleSpec(), workers: int | None = None) -> Path:
    """ROOT holding the dataset of SPEC, generated on first use (seconds per 100,000 images and core)."""
    if _complete(root, spec):
        return root
    (root / CLS_LOC / "val").mkdir(parents=True, exist_ok=True)
    workers = workers or os.cpu_count() or 1
    bounds = np.linspace(0, spec.classes, min(spec.classes, workers * 8) + 1).astype(int)
    log.info("generating %s train + %s val images in %s classes under %s", spec.train, spec.val, spec.classes, root)
    with ProcessPoolExecutor(workers) as pool:
        if spec.photo:
            (root / POOL).mkdir(exist_ok=True)
            cuts = np.linspace(0, spec.photo, workers * 8 + 1).astype(int)
            n = len(cuts) - 1
            list(pool.map(_write_pool, [str(root)] * n, [spec] * n, cuts[:-1].tolist(), cuts[1:].tolist()))
        done = list(
            pool.map(
                _write_classes,
                [str(root)] * (len(bounds) - 1),
                [spec] * (len(bounds) - 1),
                bounds[:-1].tolist(),
                bounds[1:].tolist(),
            )
        )
    wnids = synsets(spec.classes)
    _write_labels(root, spec, np.arange(spec.val))
    (root / "LOC_synset_mapping.txt").write_text("".join(f"{w} {name}\n" for w, name in wnids))
    record = {**asdict(spec), "fraction": None, "images": {"train": spec.train, "val": spec.val}, "bytes": sum(done)}
    (root / SPEC_FILE).write_text(json.dumps(record, indent=1) + "\n")
    return root


def _write_labels(root: Path, spec: CountScaleSpec, indices: np.ndarray) -> None:
    wnids, vcls = [w for w, _ in synsets(spec.classes)], val_classes(spec)
    with open(root / "LOC_val_solution.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["ImageId", "PredictionString"])
        for index in indices:
            writer.writerow([f"ILSVRC2012_val_{index + 1:08d}", f"{wnids[vcls[index]]} 1 1 40 30"])


def _complete(root: Path, spec: CountScaleSpec, fraction: float | None = None) -> bool:
    marker = root / SPEC_FILE
    if not marker.is_file():
        return False
    recorded = json.loads(marker.read_text())
    written = {k: recorded.get(k, getattr(CountScaleSpec(), k)) for k in asdict(spec)}
    return written == asdict(spec) and recorded.get("fraction") == fraction


def fraction_counts(spec: CountScaleSpec, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(train images per class, val image indices) of the FRACTION subset: the first images of every class."""
    train = np.maximum(1, np.ceil(train_counts(spec) * fraction)).astype(np.int64)
    vcls = val_classes(spec)
    per_class = max(1, math.ceil(spec.val / spec.classes * fraction))
    rank = np.zeros(spec.val, dtype=np.int64)
    for cls in range(spec.classes):
        where = np.flatnonzero(vcls == cls)
        rank[where] = np.arange(len(where))
    return train, np.flatnonzero(rank < per_class)


def link_fraction(full: Path, out: Path, spec: CountScaleSpec, fraction: float) -> Path:
    """OUT holding the FRACTION subset of FULL as hard links (same bytes, 1,000 classes, fewer images each)."""
    if fraction >= 1:
        return full
    if _complete(out, spec, fraction):
        return out
    train, val = fraction_counts(spec, fraction)
    wnids = [w for w, _ in synsets(spec.classes)]
    for cls, wnid in enumerate(wnids):
        folder = out / CLS_LOC / "train" / wnid
        folder.mkdir(parents=True, exist_ok=True)
        for n in range(int(train[cls])):
            _link(full / CLS_LOC / "train" / wnid / f"{wnid}_{n + 1}.JPEG", folder / f"{wnid}_{n + 1}.JPEG")
    (out / CLS_LOC / "val").mkdir(parents=True, exist_ok=True)
    for index in val:
        name = f"ILSVRC2012_val_{index + 1:08d}.JPEG"
        _link(full / CLS_LOC / "val" / name, out / CLS_LOC / "val" / name)
    _write_labels(out, spec, val)
    (out / "LOC_synset_mapping.txt").write_bytes((full / "LOC_synset_mapping.txt").read_bytes())
    record = {**asdict(spec), "fraction": fraction, "images": {"train": int(train.sum()), "val": len(val)}}
    (out / SPEC_FILE).write_text(json.dumps(record, indent=1) + "\n")
    return out


def _link(src: Path, dst: Path) -> None:
    if not dst.exists():
        os.link(src, dst)


def counts_of(root: Path) -> dict[str, int]:
    """Train and val image counts of a generated tree (from its spec file)."""
    return dict(json.loads((root / SPEC_FILE).read_text())["images"])
