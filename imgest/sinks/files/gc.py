"""Collect a files dataset's garbage: version folders the manifest no longer needs, and stale staging.

Kept: the version DEST/manifest.json names (``root``) and the KEEP most recent earlier ones (its ``history``, most
recent first), so readers that resolved an older version a moment ago can finish. Removed: every other folder
under ``DEST/v/`` and everything under ``DEST/_staging/`` that no running job holds (a job holds
``_staging/<key>.lock`` while it writes; those are left alone, as is ``v/<key>`` of a held key, which that job
is about to publish). A folder is first renamed into ``_staging/`` and then deleted, so a partly deleted
version never sits under ``v/``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imgest.sinks.files.layout import LOCK_SUFFIX, PARTS_SUFFIX, STAGING, VERSIONS, read_manifest, version_folder

log = logging.getLogger(__name__)
GC_SUFFIX = ".gc"


@dataclass
class GcReport:
    """What collect_files removed (or, with dry_run, would remove) and kept."""

    dest: str
    current: str
    kept: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    in_use: list[str] = field(default_factory=list)  # staging (and its version) a running job holds
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "dest": self.dest,
            "current": self.current,
            "kept": self.kept,
            "removed": self.removed,
            "in_use": self.in_use,
            "dry_run": self.dry_run,
        }


def _held(lock: Path) -> bool:
    """Whether a running job holds LOCK."""
    try:
        fh = lock.open("a")
    except FileNotFoundError:
        return False
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


def _key_of(name: str) -> str:
    for suffix in (PARTS_SUFFIX, LOCK_SUFFIX, ".replaced", GC_SUFFIX):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _remove(path: Path, trash: Path) -> None:
    """Rename PATH into TRASH (one step out of sight), then delete it."""
    if path.is_dir() and path.parent != trash:
        trash.mkdir(parents=True, exist_ok=True)
        aside = trash / f"{path.name}{GC_SUFFIX}"
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(path, aside)
        path = aside
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def collect_files(dest: Path, keep: int = 1, dry_run: bool = False) -> GcReport:
    """Remove the version folders of the files dataset under DEST that neither its manifest.json names nor are
    among the KEEP most recent earlier versions, and stale staging; DRY_RUN only reports. FilesDatasetError when
    DEST holds no published files dataset (nothing is removed then)."""
    if keep < 0:
        raise ValueError(f"keep must be 0 or more, not {keep}")
    manifest = read_manifest(dest)
    current = manifest.get("root", "")
    report = GcReport(str(dest), current, dry_run=dry_run)
    trash = dest / STAGING
    held = {_key_of(p.name) for p in trash.glob(f"*{LOCK_SUFFIX}") if _held(p)} if trash.is_dir() else set()
    wanted = [current, *[r for r in manifest.get("history", []) if (dest / r).is_dir()][:keep]]
    versions = dest / VERSIONS
    for folder in sorted(versions.iterdir()) if versions.is_dir() else []:
        rel = version_folder(folder.name)
        if rel in wanted:
            report.kept.append(rel)
        elif folder.name in held:
            report.in_use.append(rel)
        else:
            report.removed.append(rel)
    for entry in sorted(trash.iterdir()) if trash.is_dir() else []:
        rel = f"{STAGING}/{entry.name}"
        (report.in_use if _key_of(entry.name) in held else report.removed).append(rel)
    if not dry_run:
        for rel in report.removed:
            _remove(dest / rel, trash)
        if trash.is_dir() and not any(trash.iterdir()):
            trash.rmdir()
    log.info("gc %s: kept %s, %s %s", dest, report.kept, "would remove" if dry_run else "removed", report.removed)
    return report
