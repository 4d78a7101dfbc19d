"""ImageNet-21k's class count at ImageNet-1k's image count, shipped as ImageNet ships it: a tar of class tars.

21,841 classes (ImageNet-21k's ``winter21_whole.tar`` / ``fall11_whole.tar`` hold one ``<wnid>.tar`` per class),
1,331,167 small distinct JPEGs in all (about 61 a class, skewed as 21k is: a few classes hold hundreds, many a
handful), train only (21k ships no val split). Each fraction (10 %, 1 %) is a tar of its own holding the first
images of every class, so every size has all 21,841 classes and differs only in count. Generated once per spec
into ``$IMGEST_HOME/bench``, then uploaded to the S3 source bucket, where `imgest bench scale --dataset count21k`
scans it in place (ranged GETs, no download).
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import tarfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from imgest.sources.devdata.countscale import CountScaleSpec, _jpeg
from imgest.sources.devdata.sample import synsets

log = logging.getLogger(__name__)

TAR_NAME = "winter21_whole.tar"
SPEC_FILE = "count21k.json"  # written last, beside the tars: its presence with the same spec means they are complete
CHUNK = 256  # classes a generating worker handles at a time


@dataclass(frozen=True)
class Count21kSpec:
    """What to generate: ImageNet-21k's classes at ImageNet-1k's image count by default."""

    classes: int = 21_841
    images: int = 1_331_167
    width: int = 64
    height: int = 48
    seed: int = 0


def class_counts(spec: Count21kSpec) -> np.ndarray:
    """Images per class: a seeded log-normal spread (21k's long tail), at least one each, summing to SPEC.images."""
    if spec.images < spec.classes:
        raise ValueError(f"{spec.images} images cannot fill {spec.classes} classes")
    weights = np.random.default_rng([spec.seed, 21]).lognormal(0.0, 0.8, spec.classes)
    counts = 1 + np.floor(weights / weights.sum() * (spec.images - spec.classes)).astype(np.int64)
    short = spec.images - int(counts.sum())
    counts[np.argsort(-weights)[:short]] += 1  # the rounding remainder, to the largest classes
    return counts


def fraction_counts(spec: Count21kSpec, fraction: float) -> np.ndarray:
    """Images per class of the FRACTION subset: the first ceil(count x fraction) of every class, at least one."""
    return np.maximum(1, np.ceil(class_counts(spec) * fraction)).astype(np.int64)


def _member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 1_600_000_000, 0o644
    tar.addfile(info, io.BytesIO(data))


def _class_tars(spec: Count21kSpec, fractions: tuple[float, ...], first: int, last: int) -> list[list[bytes]]:
    """For classes FIRST..LAST-1: each class's inner tar per fraction (same images, first k of them)."""
    wnids = [w for w, _ in synsets(spec.classes)][first:last]
    takes = [fraction_counts(spec, f)[first:last] for f in fractions]
    jpeg_spec = CountScaleSpec(width=spec.width, height=spec.height, seed=spec.seed)
    out = []
    for i, wnid in enumerate(wnids):
        rng = np.random.default_rng([spec.seed, 22, first + i])
        images = [_jpeg(rng, jpeg_spec) for _ in range(int(takes[-1][i]))]
        per_fraction = []
        for take in takes:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as inner:
                for n in range(int(take[i])):
                    _member(inner, f"{wnid}_{n + 1}.JPEG", images[n])
            per_fraction.append(buf.getvalue())
        out.append(per_fraction)
    return out


def tar_path(root: Path, fraction: float) -> Path:
    """Where the FRACTION subset's outer tar lives under ROOT."""
    return root / f"f{fraction:g}" / TAR_NAME


def write_count21k(root: Path, fractions: list[float], spec: Count21kSpec = Count21kSpec()) -> list[Path]:
    """The outer tar of each fraction under ROOT (1 = the whole count), generated on first use; all in one pass."""
    fracs = tuple(sorted(set(fractions)))
    if fracs[-1] != max(fractions) or any(f <= 0 or f > 1 for f in fracs):
        raise ValueError(f"fractions must lie in (0, 1]: {fractions}")
    marker = root / SPEC_FILE
    made = json.loads(marker.read_text()) if marker.is_file() else {}
    same_spec = {**made, "fractions": None} == {**asdict(spec), "fractions": None}
    before = set(made.get("fractions", [])) if same_spec else set()
    if set(fracs) <= before:
        return [tar_path(root, f) for f in fractions]  # made before, with these among its fractions
    fracs = tuple(sorted(set(fracs) | before))  # the ones made before are made again with the new ones (one pass)
    marker.unlink(missing_ok=True)
    wnids = [w for w, _ in synsets(spec.classes)]
    log.info("generating %s images in %s class tars under %s", spec.images, spec.classes, root)
    with ExitStack() as stack:
        outers = []
        for f in fracs:
            tar_path(root, f).parent.mkdir(parents=True, exist_ok=True)
            outers.append(stack.enter_context(tarfile.open(tar_path(root, f), "w", format=tarfile.USTAR_FORMAT)))
        for first, tars in _generate(spec, fracs):
            for i, per_fraction in enumerate(tars):
                for outer, data in zip(outers, per_fraction, strict=True):
                    _member(outer, f"{wnids[first + i]}.tar", data)
    marker.write_text(json.dumps({**asdict(spec), "fractions": list(fracs)}) + "\n")
    return [tar_path(root, f) for f in fractions]


def _generate(spec: Count21kSpec, fracs: tuple[float, ...]) -> Iterator[tuple[int, list[list[bytes]]]]:
    """(first class, its chunk's inner tars) in class order, CHUNK classes a task over every core."""
    starts = list(range(0, spec.classes, CHUNK))
    ends = [min(s + CHUNK, spec.classes) for s in starts]
    workers = max(1, min(os.cpu_count() or 1, math.ceil(spec.classes / CHUNK)))
    with ProcessPoolExecutor(workers) as pool:
        n = len(starts)
        yield from zip(starts, pool.map(_class_tars, [spec] * n, [fracs] * n, starts, ends), strict=True)


def images_of(spec: Count21kSpec, fraction: float) -> int:
    """Images in the FRACTION subset."""
    return int(fraction_counts(spec, fraction).sum())
