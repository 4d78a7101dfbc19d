"""Task scratch folders in the system temp folder, named after their process so leftovers can be cleaned.

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


def clean_stale(base: Path | None = None) -> list[Path]:
    """Remove the scratch folders under BASE (the temp folder) left by processes that no longer run."""
    base = base or Path(tempfile.gettempdir())
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
    clean_stale()
    return tempfile.TemporaryDirectory(prefix=f"{PREFIX}{os.getpid()}-")
