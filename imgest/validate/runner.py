"""Sets up the four engines (skipping, with the reason, those this machine cannot run), runs the check and the
queue-depth sweep, and gathers the report."""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from imgest.sinks.files.layout import data_root
from imgest.validate.blockdev import NoBlockDeviceError, check_readable
from imgest.validate.blockmap import BlockMap, build_block_map
from imgest.validate.check import CheckConfig, EngineResult, external_pass, load, make_cold, run_engine
from imgest.validate.dataset import SplitView
from imgest.validate.fiemap import FiemapUnsupportedError
from imgest.validate.xnvme_lib import XnvmeIOError, XnvmeUnavailableError

log = logging.getLogger(__name__)
Advance = Callable[[int], None]


def _noop(n: int = 1) -> None:
    pass


@dataclass
class CheckReport:
    """Every engine's result, the block map (None when the block engine was skipped early) and the settings."""

    root: Path
    config: CheckConfig
    results: list[EngineResult]
    block_map: BlockMap | None
    sweep: list[dict[str, Any]] = field(default_factory=list)
    splits: list[SplitView] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no engine that ran read a wrong byte or label."""
        return all(r.status != "failed" for r in self.results)

    def result(self, engine: str) -> EngineResult | None:
        """The result of ENGINE, if it was asked for."""
        return next((r for r in self.results if r.engine == engine), None)


def block_map_or_reason(root: Path, splits: list[SplitView], advance: Advance) -> tuple[BlockMap | None, str | None]:
    """The dataset's block map, or why the block engine cannot run (DeviceAccessError is raised, not skipped)."""
    try:
        block_map = build_block_map(root, (p for split in splits for p in split.iter_paths()), advance)
    except (NoBlockDeviceError, FiemapUnsupportedError) as exc:
        return None, str(exc)
    check_readable(block_map.device)
    return block_map, None


@contextmanager
def open_engines(
    root: Path, cfg: CheckConfig, block_map: BlockMap | None, block_reason: str | None
) -> Iterator[tuple[dict[str, Any], dict[str, str]]]:
    """({engine: reader or None for DALI's own}, {skipped engine: reason}); closes the engines afterwards."""
    from imgest.validate.engines import PythonFileEngine, XnvmeBlockEngine, XnvmeFileEngine

    readers: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    with ExitStack() as stack:
        for name in cfg.engines:
            try:
                if name == "dali_file":
                    readers[name] = None
                    continue
                if name == "python_file":
                    engine: Any = PythonFileEngine(root)
                elif name == "xnvme_file":
                    engine = XnvmeFileEngine(root, cfg.file_queue_depth, cfg.file_chunk)
                elif block_map is None:
                    skipped[name] = block_reason or "no block map"
                    continue
                else:
                    engine = XnvmeBlockEngine(root, block_map, cfg.queue_depth)
            except (XnvmeUnavailableError, XnvmeIOError) as exc:
                skipped[name] = str(exc)
                continue
            stack.callback(engine.close)
            readers[name] = engine
        for name, reason in skipped.items():
            log.warning("engine %s skipped: %s", name, reason)
        yield readers, skipped


@contextmanager
def reader_views(splits: list[SplitView]) -> Iterator[list[SplitView]]:
    """SPLITS, each sampled one that has no reader folder given one: a temporary folder of symlinks to exactly
    its images under every class folder of the split (empty ones too, so fn.readers.file assigns the same labels).
    Removed on exit."""
    if all(s.full or s.reader_dir is not None for s in splits):
        yield splits
        return
    with tempfile.TemporaryDirectory(prefix="imgest-xnvme-view-") as tmp:
        views = []
        for split in splits:
            if split.full or split.reader_dir is not None:
                views.append(split)
                continue
            view = Path(tmp) / split.split
            for wnid in split.classes:
                (view / wnid).mkdir(parents=True)
            for rel in split.iter_paths():
                os.symlink(split.root.absolute() / rel, view / rel.split("/", 1)[1])
            views.append(replace(split, reader_dir=view))
        yield views


def run_check(
    root: Path,
    cfg: CheckConfig,
    advance: Advance = _noop,
    skip: dict[str, str] | None = None,
    splits: list[SplitView] | None = None,
) -> CheckReport:
    """Run every engine of CFG over the files dataset at ROOT; the report says what matched and how fast.

    Reads CFG.sample images of each split (seeded, class-balanced; 0: every image), or the given SPLITS. SKIP names
    engines the caller already knows cannot run here, with the reason.
    """
    if splits is None:
        root = data_root(root)  # the version folder ROOT/manifest.json names; the engines read under it
        splits = load(root, cfg)
    block_map, block_reason = (None, (skip or {}).get("xnvme_block", "not asked for"))
    if "xnvme_block" in cfg.engines and "xnvme_block" not in (skip or {}):
        block_map, block_reason = block_map_or_reason(root, splits, advance)
    results = []
    ref_labels: dict[str, np.ndarray] = {}
    engines = sorted(cfg.engines, key=lambda e: e != "dali_file")  # the reference first: it sets the labels
    with (
        open_engines(root, replace(cfg, engines=tuple(engines)), block_map, block_reason) as (readers, skipped),
        reader_views(splits) as views,
    ):
        for name in engines:
            reason = (skip or {}).get(name) or skipped.get(name)
            if reason:
                results.append(EngineResult(name, status="skipped", reason=reason))
                continue
            reader = readers[name]
            read = None if reader is None else reader.read_batch
            result = run_engine(name, read, views, cfg, ref_labels, advance)
            result.info = {"backend": "DALI fn.readers.file", "queue_depth": None} if reader is None else reader.info()
            log.info("engine %s: %s, %.0f img/s", name, result.status, result.img_s or 0)
            results.append(result)
    return CheckReport(root, cfg, results, block_map, splits=splits)


def run_sweep(report: CheckReport, depths: list[int], advance: Advance = _noop) -> list[dict[str, Any]]:
    """img/s of the xNVMe engines at each queue depth in DEPTHS (timed passes only), relative to python_file."""
    splits = report.splits or load(report.root, report.config)
    base = report.result("python_file")
    base_rate = base.img_s if base else None
    rows = []
    for engine in ("xnvme_file", "xnvme_block"):
        ran = report.result(engine)
        if ran is None or ran.status == "skipped":
            continue
        for depth in depths:
            cfg = replace(report.config, rounds=report.config.rounds, engines=(engine,))
            cfg = replace(cfg, queue_depth=depth) if engine == "xnvme_block" else replace(cfg, file_queue_depth=depth)
            with open_engines(report.root, cfg, report.block_map, None) as (readers, skipped):
                if engine in skipped:
                    continue
                seconds = time_engine(readers[engine].read_batch, splits, cfg, advance)
                info = readers[engine].info()
            images = sum(len(s) for s in splits)
            rate = images / seconds if seconds else None
            rows.append(
                {
                    "engine": engine,
                    "queue_depth": depth,
                    "backend": info["backend"],
                    "img_s": rate,
                    "relative_to_python_file": rate / base_rate if rate and base_rate else None,
                }
            )
    report.sweep = rows
    return rows


def time_engine(read: Any, splits: list[SplitView], cfg: CheckConfig, advance: Advance) -> float:
    """Seconds inside pipe.run() to read every split once (median of CFG.rounds passes; each from the device with
    CFG.cold)."""
    total = 0.0
    for split in splits:
        passes = []
        for _ in range(max(1, cfg.rounds)):
            make_cold(split, cfg)
            passes.append(external_pass(read, split, cfg, advance))
        total += statistics.median(passes)
    return total
