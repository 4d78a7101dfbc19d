"""The generated sample datasets: deterministic, ImageNet-like sizes, the documented layouts."""

from __future__ import annotations

import csv
import hashlib
import io
import statistics
from pathlib import Path

from PIL import Image

from imgest.sources.devdata.sample import SampleSpec, write_sample


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    spec = SampleSpec("imagefolder", classes=2, per_class=2, val_per_class=1, seed=5)
    write_sample(tmp_path / "a", spec)
    write_sample(tmp_path / "b", spec)
    write_sample(tmp_path / "c", SampleSpec("imagefolder", classes=2, per_class=2, val_per_class=1, seed=6))
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    assert _digest(tmp_path / "a") != _digest(tmp_path / "c")


def test_cls_loc_layout_files(tmp_path: Path) -> None:
    counts = write_sample(tmp_path, SampleSpec("cls-loc", classes=3, per_class=2, val_per_class=2))
    assert counts == {"train": 6, "val": 6}
    data = tmp_path / "ILSVRC" / "Data" / "CLS-LOC"
    assert sorted(p.name for p in (data / "train").iterdir()) == ["n01440764", "n01443537", "n01484850"]
    assert (data / "train" / "n01440764" / "n01440764_1.JPEG").is_file()
    assert sorted(p.name for p in (data / "val").iterdir())[0] == "ILSVRC2012_val_00000001.JPEG"
    with open(tmp_path / "LOC_val_solution.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 6
    assert rows[0]["PredictionString"].split()[0] == "n01440764"
    mapping = (tmp_path / "LOC_synset_mapping.txt").read_text().splitlines()
    assert mapping[0] == "n01440764 tench, Tinca tinca"


def test_sizes_look_like_imagenet(tmp_path: Path) -> None:
    write_sample(tmp_path, SampleSpec("imagefolder", classes=4, per_class=10, val_per_class=0, large_every=40))
    files = sorted(tmp_path.rglob("*.JPEG"))
    sizes = [Image.open(io.BytesIO(f.read_bytes())).size for f in files]
    kbs = [f.stat().st_size / 1024 for f in files]
    small = [kb for kb, (w, h) in zip(kbs, sizes, strict=True) if w * h < 1_000_000]
    large = [(w, h) for w, h in sizes if w * h >= 2_000_000]
    assert len(files) == 40
    assert len(large) == 1  # one in forty is a photo of several megapixels
    assert 50 <= statistics.median(small) <= 150
    assert statistics.median(w for w, _ in sizes) in range(375, 641)
