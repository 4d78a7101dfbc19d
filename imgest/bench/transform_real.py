"""`imgest bench transform --source DIR`: the transform on a folder of real files, judged image by image.

Every file under each source folder (recursively) is run through three pipelines: imgest's transform, the plain
Pillow pipeline (imgest.bench.transform_speed.baseline_transform) and the full-precision reference (full decode,
Lanczos, no JPEG). Per image, the quality figure is PSNR(imgest) - PSNR(Pillow), both against the reference;
per group of sizes, its distribution (mean, 5th percentile, worst, the worst files named) and the speed-up of
imgest over Pillow, one core, the pipelines interleaved round by round. The quarantine check: every file Pillow
decodes must be transformed; every file it refuses must be quarantined with a reason (or transformed).

The default set is the one scripts/real_photos.py builds from registry packages (.imgest/bench/real-photos).
"""

from __future__ import annotations

import io
import logging
import math
import statistics
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imgest.bench.measure import meets
from imgest.core.paths import state_dir
from imgest.core.quarantine import BadImage
from imgest.core.report import pyplot, save_figure
from imgest.transform.image import TransformSpec, transform_image

log = logging.getLogger(__name__)

REAL_SET = "bench/real-photos"
# (group, smallest pixel count, largest): targets apply to the ImageNet-size and >= 2 MP groups (issue 27).
SIZE_GROUPS = (
    ("real: < 0.1 MP", 0, 100_000),
    ("real: imagenet-size", 100_000, 500_000),
    ("real: 0.5-2 MP", 500_000, 2_000_000),
    ("real: >= 2 MP", 2_000_000, math.inf),
)
CODING_SPLIT = ("real: imagenet-size",)  # groups also reported per coding: baseline and progressive files apart
SPEED_TARGETS = {"real: imagenet-size": 2.5, "real: >= 2 MP": 3.0}
QUALITY_TARGETS = {"mean_db": 0.0, "p5_db": -0.5}  # PSNR(imgest) - PSNR(Pillow)
WORST_NAMED = 5


def default_real_set() -> Path:
    """Where scripts/real_photos.py puts the real-photo set."""
    return state_dir() / REAL_SET


@dataclass(frozen=True)
class Judged:
    """One file: what each pipeline made of it (quality only where both transformed it)."""

    name: str
    data: bytes
    pixels: int
    pillow_error: str | None
    quarantined: str | None
    psnr_pillow: float | None = None
    psnr_imgest: float | None = None

    @property
    def delta(self) -> float | None:
        if self.psnr_pillow is None or self.psnr_imgest is None:
            return None
        return self.psnr_imgest - self.psnr_pillow


def judge(name: str, data: bytes, spec: TransformSpec) -> Judged:
    """Run the three pipelines on one file."""
    from PIL import Image

    from imgest.bench.transform_speed import baseline_transform, psnr, reference_pixels

    try:
        with Image.open(io.BytesIO(data)) as img:
            pixels = img.size[0] * img.size[1]
        baseline = baseline_transform(data, spec)
        reference = reference_pixels(data, spec)
        pillow_error = None
    except Exception as exc:  # whatever Pillow raises for a file it cannot read
        pixels, baseline, reference, pillow_error = 0, b"", None, f"{type(exc).__name__}: {exc}"
    try:
        ours = transform_image(data, spec).data
        quarantined = None
    except BadImage as bad:
        ours, quarantined = b"", f"{bad.reason}: {bad.detail}"
    if reference is None or quarantined is not None:
        return Judged(name, data, pixels, pillow_error, quarantined)
    return Judged(name, data, pixels, None, None, float(psnr(baseline, reference)), float(psnr(ours, reference)))


def load_folder(folder: Path) -> list[tuple[str, bytes]]:
    """(name relative to FOLDER, bytes) of every file under FOLDER except the set's origin list, sorted."""
    if not folder.is_dir():
        raise FileNotFoundError(
            f"benchmark source {folder} is not a folder (build the real set: scripts/real_photos.py)"
        )
    return [
        (str(p.relative_to(folder)), p.read_bytes())
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.suffix not in (".tsv", ".txt", ".json")
    ]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def quality(judged: list[Judged]) -> dict[str, Any]:
    """The distribution of PSNR(imgest) - PSNR(Pillow) over JUDGED, with the worst files named."""
    scored = sorted((j for j in judged if j.delta is not None), key=lambda j: j.delta or 0.0)
    deltas = [j.delta for j in scored if j.delta is not None]
    if not deltas:
        return {"images_scored": 0}
    mean, p5 = statistics.mean(deltas), _percentile(deltas, 0.05)
    return {
        "images_scored": len(deltas),
        "psnr_baseline_db": round(statistics.mean(j.psnr_pillow or 0.0 for j in scored), 2),
        "psnr_imgest_db": round(statistics.mean(j.psnr_imgest or 0.0 for j in scored), 2),
        "delta_mean_db": round(mean, 3),
        "delta_p5_db": round(p5, 3),
        "delta_worst_db": round(deltas[0], 3),
        "delta_best_db": round(deltas[-1], 3),
        "below_minus_0_5_db": sum(d < -0.5 for d in deltas),
        "worst_files": [[j.name, round(j.delta or 0.0, 3)] for j in scored[:WORST_NAMED]],
        "meets_quality_target": mean >= QUALITY_TARGETS["mean_db"] - 5e-4 and p5 >= QUALITY_TARGETS["p5_db"],
    }


def _quality_target(group: str, summary: dict[str, Any]) -> dict[str, Any]:
    """SUMMARY with its verdict kept only where the group has targets (the ImageNet-size and >= 2 MP ones)."""
    if group not in SPEED_TARGETS:
        summary["meets_quality_target"] = None
    return summary


def speed(judged: list[Judged], spec: TransformSpec, rounds: int) -> dict[str, Any]:
    """Images/s of imgest and Pillow on the files both transform (imgest.bench.transform_speed.speed_summary)."""
    from imgest.bench.transform_speed import speed_summary

    batch = [j.data for j in judged if j.delta is not None]
    return speed_summary(batch, spec, rounds) if batch else {}


def quarantine_check(judged: list[Judged]) -> dict[str, Any]:
    """Whether every file Pillow decodes was transformed, and what became of those it refuses."""
    lost = [[j.name, j.quarantined] for j in judged if j.pillow_error is None and j.quarantined is not None]
    refused = [
        {"file": j.name, "pillow": j.pillow_error, "imgest": j.quarantined or "transformed"}
        for j in judged
        if j.pillow_error is not None
    ]
    return {
        "files": len(judged),
        "pillow_decodes": sum(j.pillow_error is None for j in judged),
        "imgest_transformed": sum(j.quarantined is None for j in judged),
        "decodable_but_quarantined": lost,
        "pillow_refuses": refused,
        "meets_target": not lost and all(r["imgest"] != "" for r in refused),
    }


def _groups(judged: list[Judged]) -> list[tuple[str, list[Judged]]]:
    """(group, its files that both pipelines transformed) per size group; the ImageNet-size one also split by coding
    (CODING_SPLIT: baseline SOF0/1, progressive SOF2), right after it."""
    from imgest.bench.transform_peers import jpeg_kind

    out = []
    for group, low, high in SIZE_GROUPS:
        members = [j for j in judged if low <= j.pixels < high and j.delta is not None]
        out.append((group, members))
        if group in CODING_SPLIT:
            codings = [(j, jpeg_kind(j.data)) for j in members]
            for coding in ("baseline", "progressive"):
                out.append((f"{group}, {coding}", [j for j, k in codings if k is not None and k.coding == coding]))
    return out


def _group_row(group: str, members: list[Judged], spec: TransformSpec, rounds: int) -> dict[str, Any]:
    """One group's speed and quality (targets only where SPEED_TARGETS has the group)."""
    target = SPEED_TARGETS.get(group)
    row: dict[str, Any] = {
        "group": group,
        "images": len(members),
        "mean_megapixels": round(statistics.mean(j.pixels for j in members) / 1e6, 2),
        "mean_kb": round(statistics.mean(len(j.data) for j in members) / 1024, 1),
        **speed(members, spec, rounds),
        **_quality_target(group, quality(members)),
        "target_speedup": target,
    }
    row["meets_target"] = meets(row["speedup"], target)
    log.info("%s: %d images timed", group, len(members))
    return row


def run_sources(sources: list[Path], spec: TransformSpec, rounds: int) -> dict[str, Any]:
    """Judge every file of SOURCES, then time each size group; the report's real-photo part."""
    judged: list[Judged] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pillow's warnings about odd EXIF or MPO headers in the test files
        for folder in sources:
            for name, data in load_folder(folder):
                judged.append(judge(f"{folder.name}/{name}", data, spec))
        groups = [_group_row(group, members, spec, rounds) for group, members in _groups(judged) if members]
    from imgest.bench.transform_peers import jpeg_kind

    per_image = [
        [j.name, round(j.pixels / 1e6, 3), round(j.psnr_pillow, 2), round(j.psnr_imgest, 2), round(j.delta, 3), coding]
        for j, coding in ((j, getattr(jpeg_kind(j.data), "coding", None)) for j in judged)
        if j.delta is not None and j.psnr_pillow is not None and j.psnr_imgest is not None
    ]
    return {
        "sources": [str(s) for s in sources],
        "groups": groups,
        "quarantine": quarantine_check(judged),
        "per_image_columns": ["file", "megapixels", "psnr_pillow_db", "psnr_imgest_db", "delta_db", "coding"],
        "per_image": per_image,
    }


def distribution_plot(path: Path, report: dict[str, Any]) -> None:
    """Per-image PSNR(imgest) - PSNR(Pillow) by size group (points and the 5th percentile), and the speed-ups."""
    plt = pyplot()

    groups = report["groups"]
    bounds = {g: (low, high) for g, low, high in SIZE_GROUPS}
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    for i, g in enumerate(groups):
        size_group, _, coding = g["group"].partition(", ")
        low, high = bounds[size_group]
        deltas = [
            row[4]
            for row in report["per_image"]
            if low <= row[1] * 1e6 < high and (not coding or (row[5:] or [None])[0] == coding)
        ]
        xs = [i + 0.25 * math.sin(k * 2.4) for k in range(len(deltas))]  # deterministic jitter
        ax.scatter(xs, deltas, s=9, alpha=0.6)
        ax.hlines([g["delta_p5_db"]], i - 0.35, i + 0.35, colors="red", label="5th percentile" if i == 0 else None)
        ax.hlines([g["delta_mean_db"]], i - 0.35, i + 0.35, colors="black", label="mean" if i == 0 else None)
    ax.axhline(-0.5, color="red", linestyle=":", linewidth=1)
    ax.axhline(0, color="grey", linewidth=0.5)
    ax.set_xticks(range(len(groups)), [f"{g['group'][6:]}\n(n={g['images']})" for g in groups])
    ax.set_ylabel("PSNR(imgest) - PSNR(Pillow), dB")
    ax.set_title("Per image, against the full-precision reference")
    ax.legend(loc="lower right", fontsize=8)
    bars = bx.bar(range(len(groups)), [g["speedup"] for g in groups], color="tab:green")
    bx.bar_label(bars, fmt="%.2fx", fontsize=8)
    for i, g in enumerate(groups):
        if g.get("target_speedup"):
            bx.hlines([g["target_speedup"]], i - 0.4, i + 0.4, colors="red", linestyles="--")
    bx.set_xticks(range(len(groups)), [g["group"][6:] for g in groups], fontsize=8)
    bx.set_ylabel("speed-up over Pillow (one core)")
    bx.set_title("Speed (red: target)")
    fig.suptitle(f"Transform on real photos ({report.get('decoder', '')}, 256 -> crop 224, q90)")
    save_figure(fig, path)
