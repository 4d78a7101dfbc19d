"""Awkward and broken files that real datasets contain, planted into a sample to exercise every path.

Each planted file knows its expected fate: kept (odd but valid), skipped as junk, or quarantined with
a given reason. Tests and the demo compare what imgest did against these expectations.
"""

from __future__ import annotations

import functools
import io
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

from imgest.sources.devdata.images import photo_like

BOMB_SIDE = 20_000  # 400 megapixels


@functools.cache
def png_bomb(side: int = BOMB_SIDE) -> bytes:
    """A valid grayscale PNG of SIDE x SIDE zero pixels: small on disk, SIDE**2 bytes once decoded (made once per
    process: compressing its 400 M zero bytes takes a second)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    comp = zlib.compressobj(9)
    row = bytes(side + 1)  # filter byte + pixels
    idat = b"".join(comp.compress(row) for _ in range(side)) + comp.flush()
    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _encode(img: Image.Image, fmt: str, **kw: object) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **kw)
    return out.getvalue()


def awkward_images(seed: int = 0) -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, expected fate) for valid-but-unusual images; fate 'kept'."""
    rng = np.random.default_rng([seed, 99])
    rgb = photo_like(rng, 500, 375, np.array([0.2, 0.6, 0.3]))
    rgba = rgb.convert("RGBA")
    rgba.putalpha(Image.linear_gradient("L").resize(rgb.size))
    palette = rgb.quantize(64)
    palette_t = palette.copy()
    palette_t.info["transparency"] = 0
    gray16 = Image.fromarray((np.asarray(rgb.convert("L"), dtype=np.uint16) * 257).astype("<u2"))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise for display
    return {
        "cmyk.JPEG": (_encode(rgb.convert("CMYK"), "JPEG", quality=90), "kept"),
        "grayscale.JPEG": (_encode(rgb.convert("L"), "JPEG", quality=90), "kept"),
        "png_inside.JPEG": (_encode(rgb, "PNG"), "kept"),
        "rgba.png": (_encode(rgba, "PNG"), "kept"),
        "palette.png": (_encode(palette, "PNG"), "kept"),
        "palette_transparent.png": (_encode(palette_t, "PNG"), "kept"),
        "gray16.png": (_encode(gray16, "PNG"), "kept"),
        "exif_rotated.JPEG": (_encode(rgb, "JPEG", quality=90, exif=exif.tobytes()), "kept"),
    }


def broken_images(seed: int = 0) -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, quarantine reason) for files that must not be stored (a new dict per call)."""
    return dict(_broken_images(seed))


@functools.cache
def _broken_images(seed: int) -> dict[str, tuple[bytes, str]]:
    rng = np.random.default_rng([seed, 98])
    good = _encode(photo_like(rng, 500, 375, np.array([0.5, 0.5, 0.5])), "JPEG", quality=90)
    return {
        "empty.JPEG": (b"", "empty"),
        "notes_named.JPEG": (b"This is a text file saved with a .JPEG name.\n" * 20, "not-an-image"),
        "truncated.JPEG": (good[: len(good) // 2], "corrupt"),
        "garbled_header.JPEG": (good[:2] + b"\xff\xc0\x00\x11\x00\x00\x00" + bytes(200), "corrupt"),
        "bomb.png": (png_bomb(), "too-large"),
    }


JUNK_FILES = {".DS_Store": b"\x00\x00\x00\x01Bud1", "Thumbs.db": b"\xd0\xcf\x11\xe0", "README.txt": b"notes\n"}


def plant_defects(class_dir: Path, seed: int = 0) -> dict[str, str]:
    """Write awkward, broken and junk files into CLASS_DIR; returns relative name -> expected fate."""
    expected: dict[str, str] = {}
    for name, (data, fate) in {**awkward_images(seed), **broken_images(seed)}.items():
        (class_dir / name).write_bytes(data)
        expected[name] = fate
    for name, data in JUNK_FILES.items():
        (class_dir / name).write_bytes(data)
        expected[name] = "junk"
    hidden = class_dir / ".thumbnails"
    hidden.mkdir(exist_ok=True)
    (hidden / "cached.JPEG").write_bytes((class_dir / "cmyk.JPEG").read_bytes())
    return expected
