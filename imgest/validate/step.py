"""The DAG's ``validate_xnvme`` step (and ``imgest validate xnvme``) as one function: check, write, summarise."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

from imgest.core import workdir
from imgest.readback.pipelines import dali_missing
from imgest.sinks.files.layout import data_root
from imgest.validate.check import CheckConfig, ValidationError, load
from imgest.validate.dataset import SplitView
from imgest.validate.loopfs import LoopMount, LoopUnavailableError, copy_in, image_size_mb, loop_mounted
from imgest.validate.report import write_outputs
from imgest.validate.runner import run_check, run_sweep

log = logging.getLogger(__name__)


def loop_size_mb(dataset_dir: Path, splits: list[SplitView], fstype: str) -> int:
    """A loop filesystem image size that holds the images of SPLITS and DATASET_DIR's top-level files."""
    top = [p for p in dataset_dir.iterdir() if p.is_file()]
    nbytes = sum(s.nbytes for s in splits) + sum(p.stat().st_size for p in top)
    return image_size_mb(nbytes, sum(len(s) for s in splits) + len(top), fstype)


def copy_checked(dataset_dir: Path, mount: LoopMount, splits: list[SplitView]) -> list[SplitView]:
    """Copy the images of SPLITS (only those) onto MOUNT; the same splits, read from the copy."""
    root = copy_in(dataset_dir, mount, (p for split in splits for p in split.iter_paths()))
    return [split.moved_to(root, root / split.split) for split in splits]  # the copy's folders hold just these


def dali_skips(cfg: CheckConfig) -> dict[str, str]:
    """{"dali_file": why} where DALI cannot be imported (logged once): DALI's file reader is skipped, the other
    engines feed a host pipeline (their bytes still hashed; their labels then compared with none of DALI's)."""
    reason = dali_missing()
    if reason is None:
        return {}
    log.warning("xNVMe validation without DALI: %s; dali_file skipped, the other engines read to host memory", reason)
    return {"dali_file": reason} if "dali_file" in cfg.engines else {}


def validate_xnvme_step(
    dataset_dir: Path,
    out_dir: Path,
    *,
    config: CheckConfig | None = None,
    loop_fs: str | None = None,
    sweep: list[int] | None = None,
    advance: Callable[[int], None] | None = None,
    json_path: Path | None = None,
    plot_path: Path | None = None,
) -> dict[str, Any]:
    """Check the files dataset at DATASET_DIR with every engine; write the report, plot and block map to OUT_DIR.

    CONFIG.sample images of each split are read (a seeded, class-balanced sample; 0: every image). LOOP_FS (ext4
    or xfs) first copies those images onto a fresh loop-mounted filesystem of that type and checks the copy, so the
    block engine has a block device it may read; where that is not permitted the block engine is skipped with the
    reason, and so is DALI's file reader where DALI is not installed (dali_skips). SWEEP adds a queue-depth sweep
    of the xNVMe engines. CONFIG.cold times every pass with the images (and the loop image) dropped from the page
    cache first. Returns the report's summary (``plot`` None where none was drawn); raises ValidationError (after
    writing the report) when any engine read a wrong byte or label.
    """
    cfg = config or CheckConfig()
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = json_path or out_dir / workdir.XNVME_REPORT
    plot_path = plot_path or out_dir / workdir.XNVME_PLOT
    tick = advance or (lambda n=1: None)
    dataset_dir = data_root(dataset_dir)  # the version folder DATASET_DIR/manifest.json names
    splits = load(dataset_dir, cfg)
    with ExitStack() as stack:
        root, skip = dataset_dir, {}
        if loop_fs:
            root, splits, cfg, skip = _on_loop_fs(stack, dataset_dir, out_dir, splits, loop_fs, cfg)
        report = run_check(root, cfg, tick, {**skip, **dali_skips(cfg)}, splits)
        if sweep:
            run_sweep(report, sweep, tick)
        doc, plot = write_outputs(report, json_path, plot_path, out_dir / workdir.XNVME_BLOCK_MAP)
    summary = {
        "ok": doc["ok"],
        "loop_fs": loop_fs,
        "cache": "cold" if cfg.cold else "warm",
        "report": str(json_path),
        "plot": str(plot) if plot else None,  # None: no matplotlib (imgest[plots]) here, or no engine ran
        "engines": {
            r["engine"]: {k: r[k] for k in ("status", "img_s", "relative_to_python_file")} for r in doc["engines"]
        },
        "skipped": doc["skipped"],
        "sample": doc["sample"],
        "checked": doc["checked"],
        "full": doc["full"],
        "mismatches": doc["mismatch_count"],
        "best_xnvme_relative_to_python_file": doc["best_xnvme_relative_to_python_file"],
    }
    if not doc["ok"]:
        raise ValidationError(
            f"{dataset_dir}: {summary['mismatches']} samples did not read back as ingested; see {json_path}: "
            + "; ".join(
                f"{m['engine']} {m['path']} expected {m['expected']} read {m['actual']}" for m in doc["mismatches"][:5]
            )
        )
    return summary


def _on_loop_fs(
    stack: ExitStack, dataset_dir: Path, out_dir: Path, splits: list[SplitView], loop_fs: str, cfg: CheckConfig
) -> tuple[Path, list[SplitView], CheckConfig, dict[str, str]]:
    """SPLITS copied onto a fresh loop-mounted LOOP_FS filesystem (unmounted when STACK closes): the root to check,
    the copied splits, CFG (cold: the loop image evicted too) and the engines to skip (none; the block engine's
    reason when no loop filesystem may be mounted here, the dataset then checked where it is)."""
    root, skip = dataset_dir, {}
    try:
        size = loop_size_mb(dataset_dir, splits, loop_fs)
        mount = stack.enter_context(loop_mounted(out_dir / "loopfs", size, loop_fs))
        splits = copy_checked(dataset_dir, mount, splits)
        root = splits[0].root
        if cfg.cold and mount.image is not None:  # its blocks are cached under the image file too
            cfg = replace(cfg, evict_also=(*cfg.evict_also, str(mount.image)))
    except LoopUnavailableError as exc:
        log.warning("no loop-mounted %s filesystem: %s", loop_fs, exc)
        skip["xnvme_block"] = f"no loop-mounted {loop_fs} filesystem: {exc}"
    return root, splits, cfg, skip
