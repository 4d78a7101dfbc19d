"""`imgest bench transform --peers`: imgest's transform against the peers practitioners use (issue 44), per group.

Per group of files (imgest.bench.transform_peers.groups_of: baseline, progressive, grey, CMYK, arithmetic at
ImageNet size; >= 2 MP), every pipeline runs on the same files, interleaved round by round: images per CPU second
(the process's CPU time: one core, whatever else shares the machine) and per wall second, medians over rounds;
PSNR of each output against the full-precision reference (imgest.bench.transform_speed.reference_pixels): mean,
5th percentile and worst, and the same for the difference from the full Pillow decode's PSNR. The run is watched
(imgest.bench.measure.QuietWatch): on a machine that was not quiet no target is met.
"""

from __future__ import annotations

import io
import logging
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from imgest.bench import transform_peers as tp
from imgest.bench.machine import machine_info
from imgest.bench.measure import Quietness, QuietWatch, meets
from imgest.core.report import format_table, pyplot, save_figure
from imgest.transform.image import TransformSpec, transform_image

FULL, IMGEST, SIMD = "pillow-full", "imgest", "pillow-simd"
# imgest's speed over the best peer's, per CPU second, with PSNR not below that peer's (issue 44)
TARGETS = {"real: progressive": 1.5, "generated: progressive": 1.5}
GROUP_ORDER = ("baseline", "progressive", "grey", "CMYK", "arithmetic", ">= 2 MP")

log = logging.getLogger(__name__)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _psnr_stats(values: list[float], prefix: str) -> dict[str, float]:
    return {
        f"{prefix}_mean_db": round(statistics.mean(values), 3),
        f"{prefix}_p5_db": round(_percentile(values, 0.05), 3),
        f"{prefix}_worst_db": round(min(values), 3),
    }


def in_process(spec: TransformSpec, peers: dict[str, str]) -> dict[str, Callable[[bytes], bytes]]:
    """The pipelines timed in this process: the full Pillow decode, imgest, and the installed PEERS."""
    from imgest.bench.transform_speed import baseline_transform

    fns: dict[str, Callable[[bytes], bytes]] = {
        FULL: lambda d: baseline_transform(d, spec),
        IMGEST: lambda d: transform_image(d, spec).data,
    }
    return fns | {name: tp.with_fallback(name, spec) for name in peers}


def _timed_pass(fn: Callable[[bytes], object], batch: list[bytes]) -> tuple[float, float]:
    c0, t0 = time.process_time(), time.perf_counter()
    for data in batch:
        fn(data)
    return time.process_time() - c0, time.perf_counter() - t0


def timings(
    fns: dict[str, Callable[[bytes], object]], simd: tp.SimdPeer | None, batch: list[bytes], rounds: int
) -> dict[str, list[tuple[float, float]]]:
    """(CPU s, wall s) of one pass of each pipeline over BATCH, ROUNDS times, the pipelines interleaved."""
    for fn in fns.values():
        fn(batch[0])  # warm-up (imports, caches)
    passes: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    if simd is not None:
        passes[SIMD] = []
    for _ in range(rounds):
        for name, fn in fns.items():
            passes[name].append(_timed_pass(fn, batch))
        if simd is not None:
            passes[SIMD].append(simd.timed())
    return passes


def quality(
    fns: dict[str, Callable[[bytes], bytes]], simd: tp.SimdPeer | None, batch: list[bytes], spec: TransformSpec
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """PSNR of every pipeline's output for each file of BATCH, and how many files each peer left to pillow-draft."""
    from imgest.bench.transform_speed import psnr, reference_pixels

    refs = [reference_pixels(d, spec) for d in batch]
    outputs = {name: [fn(d) for d in batch] for name, fn in fns.items()}
    if simd is not None:
        outputs[SIMD] = simd.outputs()
    fallbacks = {}
    for name in fns:
        if name in tp.PEERS:
            fallbacks[name] = sum(_refused(tp.PEERS[name], d, spec) for d in batch)
    scores = {name: [psnr(o, r) for o, r in zip(outs, refs, strict=True)] for name, outs in outputs.items()}
    return scores, fallbacks


def _refused(peer: Callable[[bytes, TransformSpec], bytes], data: bytes, spec: TransformSpec) -> bool:
    try:
        peer(data, spec)
    except Exception:  # the peer's own decoder refuses the file
        return True
    return False


def measure_group(
    name: str, batch: list[bytes], spec: TransformSpec, rounds: int, peers: dict[str, str], simd: tp.SimdPeer | None
) -> dict[str, Any]:
    """One group's row: per pipeline its speeds and PSNR; imgest against the best peer."""
    fns = in_process(spec, peers)
    if simd is not None:
        simd.load(batch)
    passes = timings(fns, simd, batch, rounds)
    scores, fallbacks = quality(fns, simd, batch, spec)
    pipelines = {}
    for pipe, runs in passes.items():
        deltas = [s - f for s, f in zip(scores[pipe], scores[FULL], strict=True)]
        pipelines[pipe] = {
            "images_per_cpu_s": round(statistics.median(len(batch) / max(c, 1e-9) for c, _ in runs), 1),
            "images_per_s": round(statistics.median(len(batch) / max(w, 1e-9) for _, w in runs), 1),
            "rounds_images_per_cpu_s": [round(len(batch) / max(c, 1e-9), 1) for c, _ in runs],
            **_psnr_stats(scores[pipe], "psnr"),
            **_psnr_stats(deltas, "delta_vs_full"),
            "fallbacks_to_pillow_draft": fallbacks.get(pipe, 0),
        }
    row = {"group": name, "images": len(batch), **_verdict(name, pipelines), "pipelines": pipelines}
    if name.endswith("progressive"):
        row["entropy_profile"] = entropy_profile(batch, rounds, pipelines)
    return row


def entropy_profile(batch: list[bytes], rounds: int, pipelines: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """How much of imgest's time on BATCH is libjpeg-turbo's entropy decoding of every scan (fastjpeg.check: the
    coefficients decoded, no pixel rebuilt), which every peer here pays as well; and the lead over the best peer
    that imgest could reach if everything after the entropy decoding cost nothing (the limit of any route that
    keeps libjpeg-turbo's Huffman decoder)."""
    from imgest.transform import fastjpeg

    runs = [_timed_pass(fastjpeg.check, batch)[0] for _ in range(rounds)]
    entropy_rate = statistics.median(len(batch) / max(c, 1e-9) for c in runs)
    ours = pipelines[IMGEST]["images_per_cpu_s"]
    peers = [v["images_per_cpu_s"] for k, v in pipelines.items() if k not in (FULL, IMGEST)]
    best = max(peers) if peers else None
    return {
        "entropy_only_images_per_cpu_s": round(entropy_rate, 1),
        "entropy_share_of_imgest": round(ours / entropy_rate, 3),
        "lead_limit_with_libjpeg_entropy": round(entropy_rate / best, 2) if best else None,
    }


def _verdict(name: str, pipelines: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The best peer (most images per CPU second) and imgest's lead over it, in speed and PSNR."""
    peers = {k: v for k, v in pipelines.items() if k not in (FULL, IMGEST)}
    if not peers:
        return {"best_peer": None, "target_speedup": TARGETS.get(name), "meets_target": None}
    best = max(peers, key=lambda k: peers[k]["images_per_cpu_s"])
    ours = pipelines[IMGEST]
    lead = ours["images_per_cpu_s"] / peers[best]["images_per_cpu_s"]
    psnr_ok = ours["psnr_mean_db"] >= peers[best]["psnr_mean_db"] - 5e-4
    target = TARGETS.get(name)
    met = meets(lead, target)
    return {
        "best_peer": best,
        "imgest_vs_best_peer_cpu": round(lead, 2),
        "imgest_psnr_minus_best_peer_db": round(ours["psnr_mean_db"] - peers[best]["psnr_mean_db"], 3),
        "target_speedup": target,
        "meets_target": None if met is None else bool(met and psnr_ok),
    }


def generated_sets(images: int, large_images: int, seed: int = 0) -> dict[str, list[bytes]]:
    """The generated groups: photo-like ImageNet-size JPEGs as made (baseline) and re-saved progressive, grey
    and CMYK (quality 90), and the large ones."""
    from PIL import Image

    from imgest.bench.transform import make_images

    small = make_images(images, False, seed)
    made: dict[str, list[bytes]] = {"baseline": small}
    for group, mode, opts in (("progressive", "RGB", {"progressive": True}), ("grey", "L", {}), ("CMYK", "CMYK", {})):
        made[group] = []
        for data in small:
            out = io.BytesIO()
            Image.open(io.BytesIO(data)).convert(mode).save(out, "JPEG", quality=90, **opts)
            made[group].append(out.getvalue())
    made[">= 2 MP"] = make_images(large_images, True, seed)
    return made


def decodable(data: bytes) -> bool:
    """Whether Pillow decodes DATA whole: the full-precision reference every peer is judged against needs it (a
    truncated or corrupt file is one imgest quarantines, not one to time)."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
        return True
    except Exception:  # Pillow raises OSError, SyntaxError, ValueError... on broken files
        return False


def grouped(files: list[bytes]) -> dict[str, list[bytes]]:
    """FILES by peer group (a file may be in two: an ImageNet-size one and '>= 2 MP' never overlap, though); files
    the reference cannot decode are left out (logged)."""
    groups: dict[str, list[bytes]] = {}
    kept = [data for data in files if decodable(data)]
    if len(kept) < len(files):
        dropped = len(files) - len(kept)
        log.info("left out %d of %d files the full-precision reference cannot decode", dropped, len(files))
    for data in kept:
        for group in tp.groups_of(tp.jpeg_kind(data)):
            groups.setdefault(group, []).append(data)
    return {g: groups[g] for g in GROUP_ORDER if g in groups}


def run(sets: dict[str, dict[str, list[bytes]]], spec: TransformSpec, rounds: int) -> dict[str, Any]:
    """Every group of every set (set name -> group -> files), watched for quietness."""
    peers = tp.installed_peers()
    simd = tp.SimdPeer(tp.simd_python(), spec)
    versions = {**peers, SIMD: simd.version, IMGEST: spec.jpeg_decoder, FULL: peers.get("pillow-draft")}
    try:
        with QuietWatch() as watch:
            rows = [
                measure_group(f"{set_name}: {group}", batch, spec, rounds, peers, simd if simd.version else None)
                for set_name, groups in sets.items()
                for group, batch in groups.items()
                if batch
            ]
    finally:
        simd.close()
    if not watch.result.quiet:  # a target is only met on a quiet machine
        for row in rows:
            row["meets_target"] = False if row["meets_target"] is not None else None
            row["not_quiet"] = True
    return {
        "benchmark": "transform-peers",
        "per_core": True,
        "transform": spec.as_dict(),
        "rounds": rounds,
        "versions": versions,
        "pillow_simd": simd.version or f"not built ({tp.simd_python()} missing: make install-pillow-simd)",
        "machine": machine_info(),
        "quiet": watch.result.to_dict(),
        "groups": rows,
    }


def _flat(row: dict[str, Any], key: str) -> dict[str, Any]:
    return {"group": row["group"], "images": row["images"]} | {p: v[key] for p, v in row["pipelines"].items()}


def print_tables(report: dict[str, Any]) -> None:
    """Images per CPU second, per wall second, and PSNR (mean, 5th percentile) per group and pipeline."""
    rows = report["groups"]
    pipes = list(rows[0]["pipelines"]) if rows else []
    cols = [("group", "group"), ("images", "n"), *((p, p) for p in pipes)]
    for key, title in (
        ("images_per_cpu_s", "images per CPU second (one core)"),
        ("images_per_s", "images per wall-clock second"),
        ("psnr_mean_db", "PSNR mean, dB"),
        ("psnr_p5_db", "PSNR 5th percentile, dB"),
        ("psnr_worst_db", "PSNR worst, dB"),
    ):
        print(f"\n{title}")
        print(format_table([_flat(r, key) for r in rows], cols))
    print("\nimgest against the best peer (per CPU second; PSNR mean difference)")
    verdict = [("group", "group"), ("best_peer", "best peer"), ("imgest_vs_best_peer_cpu", "imgest / best")]
    verdict += [("imgest_psnr_minus_best_peer_db", "dPSNR dB"), ("target_speedup", "target"), ("meets_target", "met")]
    print(format_table(rows, verdict))
    profiled = [{"group": r["group"], **r["entropy_profile"]} for r in rows if "entropy_profile" in r]
    if profiled:
        print("\nprogressive files: imgest's time in libjpeg-turbo's entropy decoding, and the lead it bounds")
        cols = [("group", "group"), ("entropy_only_images_per_cpu_s", "entropy only img/CPU s")]
        cols += [("entropy_share_of_imgest", "share of imgest"), ("lead_limit_with_libjpeg_entropy", "lead limit")]
        print(format_table(profiled, cols))


def plot(path: Path, report: dict[str, Any]) -> None:
    """Left: images per CPU second per group and pipeline; right: the 5th-percentile PSNR difference from the full
    Pillow decode."""
    plt = pyplot()
    rows = report["groups"]
    pipes = list(rows[0]["pipelines"]) if rows else []
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 5.2))
    width = 0.8 / max(1, len(pipes))
    for i, pipe in enumerate(pipes):
        xs = [g + i * width for g in range(len(rows))]
        ax.bar(xs, [r["pipelines"][pipe]["images_per_cpu_s"] for r in rows], width, label=pipe)
        bx.bar(xs, [r["pipelines"][pipe]["delta_vs_full_p5_db"] for r in rows], width, label=pipe)
    names = [r["group"].replace(": ", "\n") for r in rows]
    for axis in (ax, bx):
        axis.set_xticks([g + width * (len(pipes) - 1) / 2 for g in range(len(rows))], names, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("images per CPU second (one core, log)")
    ax.set_title("Speed")
    ax.legend(fontsize=7)
    bx.axhline(0, color="grey", linewidth=0.5)
    bx.set_ylabel("PSNR - PSNR(full Pillow decode), 5th percentile, dB")
    bx.set_title("Quality against the full-precision reference")
    quiet = "quiet" if report["quiet"]["quiet"] else "NOT quiet"
    fig.suptitle(f"Transform peers, one core (256 -> crop 224, q{report['transform']['quality']}; machine {quiet})")
    save_figure(fig, path)


def main(
    json_out: Path, plot_out: Path | None, images: int, large_images: int, rounds: int, sources: list[Path]
) -> dict[str, Any]:
    """Run the peers on the generated groups (IMAGES, LARGE_IMAGES; none when both are 0) and on every file of
    SOURCES, print the tables, write the JSON (and the plot)."""
    import warnings

    from imgest.bench.transform_real import load_folder
    from imgest.core.report import describe_machine, write_json

    sets: dict[str, dict[str, list[bytes]]] = {}
    if images or large_images:
        sets["generated"] = generated_sets(images, large_images)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pillow's warnings about odd EXIF or MPO headers in the real files
        if sources:
            sets["real"] = grouped([data for folder in sources for _, data in load_folder(folder)])
        report = run(sets, TransformSpec(), rounds)
    report["sources"] = [str(s) for s in sources]
    print(describe_machine(report["machine"]))
    print_tables(report)
    print(Quietness.from_dict(report["quiet"]).describe())
    write_json(json_out, report)
    if plot_out is not None:
        plot(plot_out, report)
    return report
