"""The transform benchmark's measures, shared by the generated and the real-photo sets: the plain Pillow
pipeline imgest is compared with, its full-precision reference and PSNR, and the interleaved speed rounds."""

from __future__ import annotations

import io
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from imgest.transform import fastjpeg
from imgest.transform.image import EXIF_ORIENTATION, ORIENTATION_FIX, RESAMPLE, TransformSpec, transform_image


def upright_rgb(data: bytes) -> Image.Image:
    """DATA fully decoded, as RGB, turned upright by its EXIF orientation (as every pipeline here outputs it)."""
    img = Image.open(io.BytesIO(data))
    fix = ORIENTATION_FIX.get(img.getexif().get(EXIF_ORIENTATION, 1))
    img = img.convert("RGB")
    return img if fix is None else img.transpose(fix)


def baseline_transform(data: bytes, spec: TransformSpec) -> bytes:
    """The straightforward pipeline: full decode, convert, upright, resize all, crop, encode."""
    img = upright_rgb(data)
    w, h = img.size
    scale = spec.resize / min(w, h)
    rw, rh = max(spec.resize, round(w * scale)), max(spec.resize, round(h * scale))
    img = img.resize((rw, rh), RESAMPLE)
    left, top = round((rw - spec.crop) / 2), round((rh - spec.crop) / 2)
    img = img.crop((left, top, left + spec.crop, top + spec.crop))
    out = io.BytesIO()
    img.save(out, "JPEG", quality=spec.quality)
    return out.getvalue()


def reference_pixels(data: bytes, spec: TransformSpec) -> np.ndarray:
    """Full-precision reference output: full decode, upright, Lanczos resize, crop, no re-encoding."""
    img = upright_rgb(data)
    w, h = img.size
    scale = spec.resize / min(w, h)
    rw, rh = max(spec.resize, round(w * scale)), max(spec.resize, round(h * scale))
    img = img.resize((rw, rh), Image.Resampling.LANCZOS)
    left, top = round((rw - spec.crop) / 2), round((rh - spec.crop) / 2)
    return np.asarray(img.crop((left, top, left + spec.crop, top + spec.crop)), dtype=np.float64)


def psnr(encoded: bytes, reference: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB of a decoded JPEG against REFERENCE."""
    pixels = np.asarray(Image.open(io.BytesIO(encoded)).convert("RGB"), dtype=np.float64)
    mse = float(np.mean((pixels - reference) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


def _rates(
    fns: dict[str, Callable[[bytes], object]], images: list[bytes], rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Images/s of each pipeline in each of ROUNDS passes, the pipelines interleaved pass by pass so that a
    change in machine load hits both alike (after one warm-up image each): per wall-clock second, and per second
    of this thread's CPU time (what one core spends, whatever else shares the machine)."""
    for fn in fns.values():
        fn(images[0])
    rates: dict[str, list[float]] = {name: [] for name in fns}
    cpu_rates: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0, c0 = time.perf_counter(), time.thread_time()
            for data in images:
                fn(data)
            c1, t1 = time.thread_time(), time.perf_counter()
            rates[name].append(len(images) / (t1 - t0))
            cpu_rates[name].append(len(images) / max(c1 - c0, 1e-9))
    return rates, cpu_rates


def speed_summary(batch: list[bytes], spec: TransformSpec, rounds: int) -> dict[str, Any]:
    """Images/s of imgest and of the plain Pillow pipeline on BATCH, interleaved round by round: medians, the
    speed-up with its range over rounds (wall clock; cpu_speedup: per CPU second of the timing thread), and the
    entropy bound (reading the entropy-coded data alone)."""
    pipelines: dict[str, Callable[[bytes], object]] = {
        "imgest": lambda d: transform_image(d, spec),
        "baseline": lambda d: baseline_transform(d, spec),
    }
    if fastjpeg.available():  # what reading the entropy-coded data alone costs: no decoder can go below it
        pipelines["entropy_only"] = fastjpeg.check
    rates, cpu_rates = _rates(pipelines, batch, rounds)
    ours, base = statistics.median(rates["imgest"]), statistics.median(rates["baseline"])
    cpu_ours, cpu_base = statistics.median(cpu_rates["imgest"]), statistics.median(cpu_rates["baseline"])
    entropy = statistics.median(rates["entropy_only"]) if "entropy_only" in rates else None
    speedups = [o / b for o, b in zip(rates["imgest"], rates["baseline"], strict=True)]
    return {
        "baseline_images_per_s": round(base, 1),
        "imgest_images_per_s": round(ours, 1),
        "speedup": round(ours / base, 2),
        "speedup_min": round(min(speedups), 2),
        "speedup_max": round(max(speedups), 2),
        "rounds_images_per_s": {pipe: [round(r, 1) for r in values] for pipe, values in rates.items()},
        "cpu_speedup": round(cpu_ours / cpu_base, 2),
        "rounds_images_per_cpu_s": {pipe: [round(r, 1) for r in values] for pipe, values in cpu_rates.items()},
        "entropy_only_images_per_s": round(entropy, 1) if entropy else None,
        "entropy_bound_speedup": round(entropy / base, 2) if entropy else None,
    }
