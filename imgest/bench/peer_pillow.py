"""The Pillow peer of `imgest bench transform --peers`: DCT-scaled decode (``draft``) + resize + crop + encode, the
way a practitioner who cares about speed preprocesses ImageNet with Pillow (or pillow-simd, which replaces it).

Standalone: it imports Pillow and the standard library only, so that the pillow-simd environment
(scripts/build_pillow_simd.sh) runs this very file as the peer's worker, timing the same files with its own Pillow:

    python imgest/bench/peer_pillow.py --resize 256 --crop 224 --quality 90 [--out DIR] FILE...

prints one JSON line: the Pillow version, and the process CPU seconds and wall seconds of one pass over the FILEs
(after one warm-up image); with --out it writes each output as DIR/<index>.jpg (the pass that measures quality).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import sys
import time
from pathlib import Path

from PIL import Image

EXIF_ORIENTATION = 0x0112
T = Image.Transpose
# EXIF orientation -> the transpose that makes the pixels upright (as ImageOps.exif_transpose does).
UPRIGHT = {2: T.FLIP_LEFT_RIGHT, 3: T.ROTATE_180, 4: T.FLIP_TOP_BOTTOM, 5: T.TRANSPOSE, 6: T.ROTATE_270,
           7: T.TRANSVERSE, 8: T.ROTATE_90}  # fmt: skip
TURNED = (T.TRANSPOSE, T.ROTATE_270, T.TRANSVERSE, T.ROTATE_90)  # those that swap width and height


def output_box(width: int, height: int, resize: int, crop: int) -> tuple[tuple[int, int], tuple[int, int, int, int]]:
    """(resized size, crop box in it) of an upright WIDTH x HEIGHT image: the shorter side to RESIZE, the centre
    CROP x CROP (the rounding of imgest.bench.transform_speed.reference_pixels, so outputs align with it)."""
    scale = resize / min(width, height)
    rw, rh = max(resize, round(width * scale)), max(resize, round(height * scale))
    left, top = round((rw - crop) / 2), round((rh - crop) / 2)
    return (rw, rh), (left, top, left + crop, top + crop)


def finish(img: Image.Image, width: int, height: int, resize: int, crop: int, quality: int) -> bytes:
    """IMG (upright, any size from a scaled decode of an upright WIDTH x HEIGHT picture) resized bilinear to the
    shorter side RESIZE, centre-cropped to CROP and encoded as a JPEG of QUALITY."""
    size, box = output_box(width, height, resize, crop)
    img = img.convert("RGB").resize(size, Image.Resampling.BILINEAR).crop(box)
    out = io.BytesIO()
    img.save(out, "JPEG", quality=quality)
    return out.getvalue()


def draft_transform(data: bytes, resize: int, crop: int, quality: int) -> bytes:
    """DATA decoded with libjpeg's DCT scaling (``Image.draft``: the largest 1/2, 1/4, 1/8 that keeps the shorter
    side at least RESIZE), turned upright by its EXIF orientation, resized, cropped and encoded."""
    img = Image.open(io.BytesIO(data))
    width, height = img.size
    if img.format == "JPEG":
        scale = resize / min(width, height)
        img.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
    fix = UPRIGHT.get(img.getexif().get(EXIF_ORIENTATION, 1))
    if fix is not None:
        img = img.transpose(fix)
        if fix in TURNED:
            width, height = height, width
    return finish(img, width, height, resize, crop, quality)


def _pass(files: list[bytes], resize: int, crop: int, quality: int) -> tuple[float, float]:
    draft_transform(files[0], resize, crop, quality)  # warm-up
    c0, t0 = time.process_time(), time.perf_counter()
    for data in files:
        draft_transform(data, resize, crop, quality)
    return time.process_time() - c0, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    import PIL

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resize", type=int, default=256)
    parser.add_argument("--crop", type=int, default=224)
    parser.add_argument("--quality", type=int, default=90)
    parser.add_argument("--out", type=Path, help="write the outputs here (the quality pass; not timed)")
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    files = [p.read_bytes() for p in args.files]
    record: dict[str, object] = {"pillow": PIL.__version__, "images": len(files)}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        for i, data in enumerate(files):
            (args.out / f"{i}.jpg").write_bytes(draft_transform(data, args.resize, args.crop, args.quality))
    else:
        record["cpu_s"], record["wall_s"] = _pass(files, args.resize, args.crop, args.quality)
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
