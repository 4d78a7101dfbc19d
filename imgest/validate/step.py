"""The DAG's ``validate_xnvme`` step (and ``imgest validate xnvme``) as one function: check, write, summarise."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from imgest.core import workdir
from imgest.validate.check import CheckConfig, ValidationError
from imgest.validate.loopfs import LoopUnavailableError, copy_in, image_size_mb, loop_mounted
from imgest.validate.report import write_outputs
from imgest.validate.runner import run_check, run_sweep

log = logging.getLogger(__name__)


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

    LOOP_FS (ext4 or xfs) first copies the dataset onto a fresh loop-mounted filesystem of that type and checks the
    copy, so the block engine has a block device it may read; where that is not permitted the block engine is
    skipped with the reason. SWEEP adds a queue-depth sweep of the xNVMe engines. Returns the report's summary;
    raises ValidationError (after writing the report) when any engine read a wrong byte or label.
    """
    cfg = config or CheckConfig()
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = json_path or out_dir / workdir.XNVME_REPORT
    plot_path = plot_path or out_dir / workdir.XNVME_PLOT
    tick = advance or (lambda n=1: None)
    with ExitStack() as stack:
        root, skip = dataset_dir, {}
        if loop_fs:
            try:
                mount = stack.enter_context(
                    loop_mounted(out_dir / "loopfs", image_size_mb(dataset_dir, loop_fs), loop_fs)
                )
                root = copy_in(dataset_dir, mount)
            except LoopUnavailableError as exc:
                log.warning("no loop-mounted %s filesystem: %s", loop_fs, exc)
                skip["xnvme_block"] = f"no loop-mounted {loop_fs} filesystem: {exc}"
        report = run_check(root, cfg, tick, skip)
        if sweep:
            run_sweep(report, sweep, tick)
        doc = write_outputs(report, json_path, plot_path, out_dir / workdir.XNVME_BLOCK_MAP)
    summary = {
        "ok": doc["ok"],
        "loop_fs": loop_fs,
        "report": str(json_path),
        "plot": str(plot_path),
        "engines": {
            r["engine"]: {k: r[k] for k in ("status", "img_s", "relative_to_python_file")} for r in doc["engines"]
        },
        "skipped": doc["skipped"],
        "mismatches": len(doc["mismatches"]) + len(doc["label_mismatches"]),
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
