"""Photo-like images: statistics close enough to photographs that JPEG sizes match ImageNet's."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

COMMON_SIZES = [(500, 375), (375, 500), (500, 333), (500, 400), (640, 480), (400, 300), (500, 500)]
LARGE_SIZES = [(2048, 1536), (2592, 1944), (3264, 2448)]


def photo_like(rng: np.random.Generator, width: int, height: int, hue: np.ndarray) -> Image.Image:
    """An RGB image whose statistics resemble a photograph's (the class sets the dominant hue)."""
    field = rng.random((6, 8, 3)) * 0.6 + hue * 0.4
    img = Image.fromarray((field * 255).astype(np.uint8)).resize((width, height), Image.Resampling.BICUBIC)
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(4, 12))):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        x1 = x0 + int(rng.integers(width // 12, width // 3))
        y1 = y0 + int(rng.integers(height // 12, height // 3))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)([x0, y0, x1, y1], fill=colour)
    arr = np.asarray(img.filter(ImageFilter.GaussianBlur(radius=1.5)), dtype=np.float32)
    coarse = rng.normal(0, 1, (height // 2 + 1, width // 2 + 1, 1)).astype(np.float32)
    coarse = np.repeat(np.repeat(coarse, 2, axis=0), 2, axis=1)[:height, :width]
    fine = rng.normal(0, 1, (height, width, 1)).astype(np.float32)
    return Image.fromarray(np.clip(arr + coarse * 14 + fine * 6, 0, 255).astype(np.uint8))


def jpeg_bytes(rng: np.random.Generator, hue: np.ndarray, large: bool) -> bytes:
    """One sample JPEG, sized like ImageNet's (LARGE: several megapixels)."""
    sizes = LARGE_SIZES if large else COMMON_SIZES
    width, height = sizes[int(rng.integers(0, len(sizes)))]
    out = io.BytesIO()
    photo_like(rng, width, height, hue).save(out, "JPEG", quality=int(rng.integers(80, 96)))
    return out.getvalue()
