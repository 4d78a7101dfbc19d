"""Task scratch folders, named after their process so leftovers can be cleaned.

They go to the executor's Spark scratch folder (the first of ``SPARK_LOCAL_DIRS``, set by a standalone
worker) when there is one, else to the system temp folder.

A Spark task killed mid-shard cannot remove its scratch folder; the next task that starts on that machine
removes every ``imgest-shard-<pid>-*`` folder whose process is gone.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from imgest.core.pids import pid_alive

log = logging.getLogger(__name__)
PREFIX = "imgest-shard-"


def scratch_base() -> Path:
    """The first folder of SPARK_LOCAL_DIRS when set (Spark executors), else the system temp folder."""
    local = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d.strip()]
    return Path(local[0]) if local else Path(tempfile.gettempdir())


def clean_stale(base: Path | None = None) -> list[Path]:
    """Remove the scratch folders under BASE (scratch_base()) left by processes that no longer run."""
    base = base or scratch_base()
    removed = []
    for path in base.glob(f"{PREFIX}*"):
        pid = path.name[len(PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and path.is_dir() and not pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    if removed:
        log.info("removed %d scratch folders of killed tasks under %s", len(removed), base)
    return removed


def scratch_dir() -> tempfile.TemporaryDirectory[str]:
    """A fresh scratch folder for this process (removed on exit), after cleaning those of dead processes."""
    base = scratch_base()
    clean_stale(base)
    base.mkdir(parents=True, exist_ok=True)
    return tempfile.TemporaryDirectory(prefix=f"{PREFIX}{os.getpid()}-", dir=base)
