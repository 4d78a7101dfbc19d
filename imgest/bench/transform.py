"""`imgest bench transform`: our transform against a straightforward Pillow pipeline, one core, same images.

Both produce the same output (resize shorter side to 256, center-crop 224, JPEG quality 90, bilinear).
Quality is checked too: PSNR of each output against a full-precision reference (full decode, Lanczos,
no JPEG), so a speed-up cannot come from worse pictures. "entropy bound" is the speed-up a transform would have
if it cost only libjpeg-turbo's Huffman decoding of the whole file (no pixels at all): large sources sit near it,
and pass it where the transform leaves entropy-coded data unread (the rows below the crop; since region3 the last-bit
AC refinement scans of progressive files decoded at a reduced scale).
"""

from __future__ import annotations

import io
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from imgest.bench.report import bar_chart, describe_machine, format_table, machine_info, write_json
from imgest.sources.devdata.images import jpeg_bytes
from imgest.transform import fastjpeg
from imgest.transform.image import EXIF_ORIENTATION, ORIENTATION_FIX, RESAMPLE, TransformSpec, transform_image

TARGETS = {"imagenet-size": 1.6, "large (>=2 MP)": 3.0}  # issue 18; PSNR at most 0.5 dB below Pillow


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


def make_images(count: int, large: bool, seed: int) -> list[bytes]:
    """COUNT photo-like JPEGs, ImageNet-size or of several megapixels."""
    hue = np.random.default_rng([seed, 1]).random(3)
    return [jpeg_bytes(np.random.default_rng([seed, int(large), i]), hue, large) for i in range(count)]


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


def _measure(name: str, batch: list[bytes], spec: TransformSpec, rounds: int) -> dict[str, Any]:
    speed = speed_summary(batch, spec, rounds)
    sample = batch[: min(len(batch), 20)]
    refs = [reference_pixels(d, spec) for d in sample]
    sizes = [Image.open(io.BytesIO(d)).size for d in batch]
    target = TARGETS.get(name)
    return {
        "group": name,
        "images": len(batch),
        "mean_megapixels": round(statistics.mean(w * h for w, h in sizes) / 1e6, 2),
        "mean_kb": round(statistics.mean(len(d) for d in batch) / 1024, 1),
        **speed,
        "target_speedup": target,
        "meets_target": None if target is None else speed["speedup"] >= target,
        "psnr_baseline_db": round(
            statistics.mean(psnr(baseline_transform(d, spec), r) for d, r in zip(sample, refs, strict=True)), 2
        ),
        "psnr_imgest_db": round(
            statistics.mean(psnr(transform_image(d, spec).data, r) for d, r in zip(sample, refs, strict=True)), 2
        ),
    }


def run(images: int = 150, large_images: int = 12, rounds: int = 3, seed: int = 0) -> dict[str, Any]:
    """Measure both pipelines per group (targets apply to the first two; the rest break 'large' down by size)."""
    spec = TransformSpec()
    small, large = make_images(images, False, seed), make_images(large_images, True, seed)
    groups = [_measure("imagenet-size", small, spec, rounds), _measure("large (>=2 MP)", large, spec, rounds)]
    by_size: dict[tuple[int, int], list[bytes]] = {}
    for data in large:
        by_size.setdefault(Image.open(io.BytesIO(data)).size, []).append(data)
    for (w, h), batch in sorted(by_size.items()):
        groups.append(_measure(f"  of which {w}x{h}", batch, spec, rounds))
    return {
        "benchmark": "transform",
        "per_core": True,
        "transform": spec.as_dict(),
        "baseline": "Pillow: full decode, convert RGB, resize the shorter side to 256 (bilinear), crop 224, JPEG q90",
        "rounds": rounds,
        "machine": machine_info(),
        "groups": groups,
    }


COLUMNS = [
    ("group", "sources"),
    ("images", "n"),
    ("mean_megapixels", "MP"),
    ("baseline_images_per_s", "Pillow img/s"),
    ("imgest_images_per_s", "imgest img/s"),
    ("speedup", "speed-up"),
    ("speedup_min", "min"),
    ("speedup_max", "max"),
    ("cpu_speedup", "CPU-time"),
    ("target_speedup", "target"),
    ("entropy_bound_speedup", "entropy bound"),
    ("psnr_baseline_db", "PSNR Pillow dB"),
    ("psnr_imgest_db", "PSNR imgest dB"),
]


def main(
    json_out: Path,
    plot: Path | None,
    images: int,
    large_images: int,
    rounds: int,
    sources: list[Path] | None = None,
    generated: bool = True,
) -> dict[str, Any]:
    """Run, print the table, write JSON (and the plot). SOURCES: folders of real files, judged per image
    (imgest.bench.transform_real); None: the real-photo set when it is present. GENERATED: the generated groups."""
    from imgest.bench import transform_real

    if sources is None:
        real = transform_real.default_real_set()
        sources = [real] if real.is_dir() else []
    report = (
        run(images, large_images, rounds)
        if generated
        else {
            "benchmark": "transform",
            "per_core": True,
            "transform": TransformSpec().as_dict(),
            "rounds": rounds,
            "machine": machine_info(),
            "groups": [],
        }
    )
    if sources:
        real_report = transform_real.run_sources(sources, TransformSpec(), rounds)
        report["real"] = real_report
        report["groups"] += real_report["groups"]
    print(describe_machine(report["machine"]))
    print(format_table(report["groups"], COLUMNS))
    if sources:
        print(format_table(report["real"]["groups"], REAL_COLUMNS))
        q = report["real"]["quarantine"]
        print(
            f"quarantine: {q['files']} files, Pillow decodes {q['pillow_decodes']}, imgest transformed "
            f"{q['imgest_transformed']}; decodable but quarantined: {q['decodable_but_quarantined'] or 'none'}"
        )
    write_json(json_out, report)
    if plot is not None and sources:  # the per-image distribution, with the real groups' speed-ups
        transform_real.distribution_plot(plot, report["real"] | {"decoder": report["transform"]["jpeg_decoder"]})
    elif plot is not None:
        names = [g["group"] for g in report["groups"]]
        bar_chart(
            plot,
            "Transform throughput, one core (256 -> crop 224, q90)",
            names,
            {
                "Pillow baseline": [g["baseline_images_per_s"] for g in report["groups"]],
                "imgest": [g["imgest_images_per_s"] for g in report["groups"]],
            },
            "images / s",
        )
    return report


REAL_COLUMNS = [
    ("group", "real photos"),
    ("images", "n"),
    ("speedup", "speed-up"),
    ("cpu_speedup", "CPU-time"),
    ("target_speedup", "target"),
    ("delta_mean_db", "dPSNR mean"),
    ("delta_p5_db", "p5"),
    ("delta_worst_db", "worst"),
    ("below_minus_0_5_db", "< -0.5 dB"),
]
