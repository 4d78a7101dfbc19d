"""Deterministic photo-like sample datasets in ImageNet's layouts (no downloads possible or needed).

Layouts: ``cls-loc`` (Kaggle's tree), ``imagefolder`` (imagenette2 style) and ``tar`` (ImageNet's archives:
``ILSVRC2012_img_train.tar`` of per-class tars, the flat ``ILSVRC2012_img_val.tar`` and ``LOC_val_solution.csv``,
holding the same images as ``cls-loc`` with the same seed).

Images look like photographs to a codec: smooth colour fields, solid shapes, blur and sensor-like
noise, so their JPEG sizes match ImageNet's (mostly about 500x375 and 50-150 KB; about 1 in 40 is a
large photo of several megapixels). The same arguments always give byte-identical files.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import logging
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from imgest.sources.devdata.defects import plant_defects
from imgest.sources.devdata.images import jpeg_bytes
from imgest.sources.tarsource import TRAIN_TAR, VAL_TAR

log = logging.getLogger(__name__)

# The first ImageNet synsets, so small samples carry real wnids and names.
KNOWN_SYNSETS = [
    ("n01440764", "tench, Tinca tinca"),
    ("n01443537", "goldfish, Carassius auratus"),
    ("n01484850", "great white shark, white shark, man-eater, man-eating shark, Carcharodon carcharias"),
    ("n01491361", "tiger shark, Galeocerdo cuvieri"),
    ("n01494475", "hammerhead, hammerhead shark"),
    ("n01496331", "electric ray, crampfish, numbfish, torpedo"),
    ("n01498041", "stingray"),
    ("n01514668", "cock"),
    ("n01514859", "hen"),
    ("n01518878", "ostrich, Struthio camelus"),
]
LAYOUTS = ("cls-loc", "imagefolder", "tar")


@dataclass(frozen=True)
class SampleSpec:
    """What to generate."""

    layout: str = "cls-loc"
    classes: int = 10
    per_class: int = 20
    val_per_class: int = 5
    seed: int = 0
    large_every: int = 40
    defects: bool = False


def synsets(n: int) -> list[tuple[str, str]]:
    """N (wnid, name) pairs: ImageNet's first synsets, then made-up ones in the same format."""
    extra = [(f"n9{i:07d}", f"synthetic class {i}") for i in range(len(KNOWN_SYNSETS), n)]
    return (KNOWN_SYNSETS + extra)[:n]


def _images(spec: SampleSpec, split: str) -> Iterator[tuple[int, int, bytes]]:
    """(class index, image number, bytes) for SPLIT, deterministic in (seed, split, class, number)."""
    count = spec.per_class if split == "train" else spec.val_per_class
    split_key = 0 if split == "train" else 1
    for cls in range(spec.classes):
        hue = np.random.default_rng([spec.seed, 7, cls]).random(3)
        for n in range(count):
            rng = np.random.default_rng([spec.seed, split_key, cls, n])
            large = spec.large_every > 0 and (cls * count + n) % spec.large_every == spec.large_every - 1
            yield cls, n, jpeg_bytes(rng, hue, large)


def write_sample(out: Path, spec: SampleSpec) -> dict[str, int]:
    """Write the dataset under OUT; returns counts per split. Existing files are overwritten."""
    if spec.layout not in LAYOUTS:
        raise ValueError(f"unknown layout {spec.layout!r}; choose from {', '.join(LAYOUTS)}")
    classes = synsets(spec.classes)
    if spec.layout == "tar":
        return _write_tars(out, spec, classes)
    counts = {"train": 0, "val": 0}
    root = out / "ILSVRC" / "Data" / "CLS-LOC" if spec.layout == "cls-loc" else out
    val_rows: list[tuple[str, str]] = []
    for split in ("train", "val"):
        for cls, n, data in _images(spec, split):
            wnid = classes[cls][0]
            if split == "val" and spec.layout == "cls-loc":
                image_id = f"ILSVRC2012_val_{cls * spec.val_per_class + n + 1:08d}"
                path = root / "val" / f"{image_id}.JPEG"
                val_rows.append((image_id, f"{wnid} 10 10 100 100"))
            elif split == "val":
                path = root / "val" / wnid / f"ILSVRC2012_val_{cls * spec.val_per_class + n + 1:08d}.JPEG"
            else:
                path = root / "train" / wnid / f"{wnid}_{n + 1}.JPEG"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            counts[split] += 1
    if spec.defects:
        _plant(out, root, spec, classes, val_rows)
    if spec.layout == "cls-loc":
        _write_labels(out, classes, val_rows)
    log.info("sample dataset written to %s: %s", out, counts)
    return counts


def _write_labels(out: Path, classes: list[tuple[str, str]], val_rows: list[tuple[str, str]]) -> None:
    with open(out / "LOC_val_solution.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["ImageId", "PredictionString"])
        writer.writerows(sorted(val_rows))
    (out / "LOC_synset_mapping.txt").write_text("".join(f"{w} {name}\n" for w, name in classes))


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)  # mtime 0, no owner: the same images give the same archive bytes
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def _write_tars(out: Path, spec: SampleSpec, classes: list[tuple[str, str]]) -> dict[str, int]:
    """ImageNet's archives under OUT (images as in the cls-loc sample); defects: val label defects only."""
    out.mkdir(parents=True, exist_ok=True)
    counts = {"train": 0, "val": 0}
    with tarfile.open(out / TRAIN_TAR, "w") as outer:
        for cls, images in itertools.groupby(_images(spec, "train"), key=lambda item: item[0]):
            wnid, buf = classes[cls][0], io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as inner:
                for _, n, data in images:
                    _add(inner, f"{wnid}_{n + 1}.JPEG", data)
                    counts["train"] += 1
            _add(outer, f"{wnid}.tar", buf.getvalue())
    val_rows: list[tuple[str, str]] = []
    with tarfile.open(out / VAL_TAR, "w") as val:
        for cls, n, data in _images(spec, "val"):
            image_id = f"ILSVRC2012_val_{cls * spec.val_per_class + n + 1:08d}"
            _add(val, f"{image_id}.JPEG", data)
            val_rows.append((image_id, f"{classes[cls][0]} 10 10 100 100"))
            counts["val"] += 1
        if spec.defects:
            _plant_val_label_defects(out, val, spec, classes, val_rows)
    _write_labels(out, classes, val_rows)
    log.info("sample archives written to %s: %s", out, counts)
    return counts


def _plant_val_label_defects(
    out: Path, val: tarfile.TarFile, spec: SampleSpec, classes: list[tuple[str, str]], val_rows: list[tuple[str, str]]
) -> None:
    """A val image with no label row, one labelled with a class train lacks, and a label row with no image."""
    hue = np.random.default_rng([spec.seed, 7, 0]).random(3)
    _add(val, "ILSVRC2012_val_99999999.JPEG", jpeg_bytes(np.random.default_rng([spec.seed, 9, 0]), hue, False))
    _add(val, "ILSVRC2012_val_99999997.JPEG", jpeg_bytes(np.random.default_rng([spec.seed, 9, 1]), hue, False))
    val_rows.append(("ILSVRC2012_val_99999997", "n99999999 1 1 2 2"))  # not a train class
    val_rows.append(("ILSVRC2012_val_99999998", f"{classes[0][0]} 1 1 2 2"))  # no such image
    expected = {"ILSVRC2012_val_99999999.JPEG": "no-label", "ILSVRC2012_val_99999997.JPEG": "no-label"}
    (out / EXPECTED_DEFECTS_FILE).write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")


EXPECTED_DEFECTS_FILE = "expected_defects.json"


def _plant(out: Path, root: Path, spec: SampleSpec, classes: list[tuple[str, str]], val_rows: list) -> None:
    """Plant awkward, broken and junk files; record each one's expected fate in expected_defects.json."""
    wnid = classes[0][0]
    expected = {
        (root / "train" / wnid / name).relative_to(root).as_posix(): fate
        for name, fate in plant_defects(root / "train" / wnid, spec.seed).items()
    }
    if spec.layout == "cls-loc":
        orphan = root / "val" / "ILSVRC2012_val_99999999.JPEG"  # a val image with no label row
        orphan.write_bytes((root / "train" / wnid / "cmyk.JPEG").read_bytes())
        expected[orphan.relative_to(root).as_posix()] = "no-label"
        val_rows.append(("ILSVRC2012_val_99999998", f"{wnid} 1 1 2 2"))  # a label row with no file
    (out / EXPECTED_DEFECTS_FILE).write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")


# The sample the demo and `sample: true` runs ingest: ImageNet's Kaggle layout with planted defects.
DEMO_SAMPLE = SampleSpec("cls-loc", classes=10, per_class=20, val_per_class=5, seed=0, defects=True)


def ensure_sample(root: Path, spec: SampleSpec) -> Path:
    """ROOT holding the sample of SPEC, generated on first use (the same spec always gives the same bytes)."""
    if not (root / "LOC_val_solution.csv").is_file():
        write_sample(root, spec)
    return root
