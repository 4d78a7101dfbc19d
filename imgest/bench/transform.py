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
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from imgest.bench.machine import machine_info
from imgest.bench.measure import meets
from imgest.bench.transform_speed import baseline_transform, psnr, reference_pixels, speed_summary
from imgest.core.report import bar_chart, describe_machine, format_table, write_json
from imgest.sources.devdata.images import jpeg_bytes
from imgest.transform.image import TransformSpec, transform_image

TARGETS = {"imagenet-size": 1.6, "large (>=2 MP)": 3.0}  # issue 18; PSNR at most 0.5 dB below Pillow


def make_images(count: int, large: bool, seed: int) -> list[bytes]:
    """COUNT photo-like JPEGs, ImageNet-size or of several megapixels."""
    hue = np.random.default_rng([seed, 1]).random(3)
    return [jpeg_bytes(np.random.default_rng([seed, int(large), i]), hue, large) for i in range(count)]


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
        "meets_target": meets(speed["speedup"], target),
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
