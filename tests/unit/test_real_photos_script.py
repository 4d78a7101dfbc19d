"""scripts/real_photos.py: which files of a wallpaper package become the real-photo set, and how copies are made.

The download itself (apt-get, pip) is not run here; its result is docs/bench/transform-real-origins.tsv.
"""

from __future__ import annotations

import importlib.util
import io
import shutil
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from PIL import Image, JpegImagePlugin

from imgest.core.paths import PACKAGE_DIR
from imgest.sources.devdata.images import photo_like

SCRIPT = PACKAGE_DIR.parent / "scripts" / "real_photos.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("real_photos", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _jpeg(path: Path, width: int, height: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    photo_like(np.random.default_rng(width), width, height, np.array([0.3, 0.3, 0.4])).save(path, "JPEG")


def test_one_file_per_wallpaper_the_largest_never_a_link_or_a_preview(tmp_path: Path) -> None:
    real_photos = _script()
    images = tmp_path / "usr/share/wallpapers/Autumn/contents/images"
    _jpeg(images / "1280x800.jpg", 1280, 800)
    _jpeg(images / "2560x1600.jpg", 2560, 1600)
    (images / "1280x1024.jpg").symlink_to("2560x1600.jpg")  # Plasma links resolutions to one file
    _jpeg(tmp_path / "usr/share/wallpapers/Autumn/contents/images_dark/1920x1080.jpg", 1920, 1080)
    _jpeg(tmp_path / "usr/share/wallpapers/Autumn/contents/screenshot.jpg", 400, 250)
    mate = tmp_path / "usr/share/backgrounds/mate"
    _jpeg(mate / "Elephants.jpg", 640, 480)
    _jpeg(mate / "Elephants_1920x1080.jpg", 1920, 1080)
    _jpeg(mate / "Dune.jpg", 800, 600)
    picked = sorted(str(p.relative_to(tmp_path)) for p in real_photos.wallpaper_photos(tmp_path))
    assert picked == [
        "usr/share/backgrounds/mate/Dune.jpg",
        "usr/share/backgrounds/mate/Elephants_1920x1080.jpg",
        "usr/share/wallpapers/Autumn/contents/images/2560x1600.jpg",
        "usr/share/wallpapers/Autumn/contents/images_dark/1920x1080.jpg",
    ]


@pytest.mark.parametrize(
    ("variant", "mode", "size", "check"),
    [
        ("q95-444", "RGB", (500, 333), lambda img: JpegImagePlugin.get_sampling(img) == 0),
        ("grey", "L", (500, 333), lambda img: img.layers == 1),
        ("cmyk", "CMYK", (500, 333), lambda img: "adobe" in img.info),
        ("exif6", "RGB", (333, 500), lambda img: img.getexif()[0x0112] == 6),  # stored sideways, as a camera does
        ("progressive", "RGB", (500, 333), lambda img: img.info.get("progressive") == 1),
    ],
)
def test_imagenet_size_copies_are_saved_as_named(
    tmp_path: Path, variant: str, mode: str, size: tuple[int, int], check: Callable[[Image.Image], bool]
) -> None:
    real_photos = _script()
    options = dict(real_photos.VARIANTS)[variant]
    src = tmp_path / "photo.jpg"
    _jpeg(src, 1500, 1000)
    img = Image.open(io.BytesIO(real_photos.imagenet_copy(src, options, Path(shutil.which("true") or "true"))))
    assert (img.mode, img.size) == (mode, size)
    assert check(img)
