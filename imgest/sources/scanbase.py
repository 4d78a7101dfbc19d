"""What every scanner shares (the local one and the S3 one): the layouts, which entries are not images, the
scan report."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from imgest.core.quarantine import QuarantineLog
from imgest.sources.manifest import ClassInfo
from imgest.sources.tree import Skips

LAYOUTS = ("cls-loc", "imagefolder", "flat", "tar")


IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"})


SYSTEM_FILES = frozenset({".ds_store", "thumbs.db", "desktop.ini", "icon\r"})


SPLIT_NAMES = ("train", "val", "validation", "test")


CLS_LOC_SPLITS = ("train", "val")


@dataclass
class ScanReport:
    """What a scan found besides the candidates themselves."""

    dataset: str
    layout: str
    source: str
    classes: list[ClassInfo] = field(default_factory=list)
    per_split: Counter[str] = field(default_factory=Counter)
    junk: Counter[str] = field(default_factory=Counter)
    quarantine: QuarantineLog = field(default_factory=QuarantineLog)
    missing_files: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    per_class: Counter[str] = field(default_factory=Counter)
    skipped: Skips = field(default_factory=Skips)
    broken_containers: list[dict[str, Any]] = field(default_factory=list)

    @property
    def accepted(self) -> int:
        return sum(self.per_split.values())

    @property
    def candidates(self) -> int:
        return self.accepted + len(self.quarantine)

    def summary_line(self) -> str:
        splits = ", ".join(f"{s} {n}" for s, n in sorted(self.per_split.items()))
        junk = sum(self.junk.values())
        return (
            f"{self.layout} dataset {self.dataset!r}: {self.candidates} candidates in {len(self.classes)} classes "
            f"({splits}); junk skipped {junk}; {self.quarantine.summary_line(self.candidates, self.accepted, 'kept')}"
            f"; label rows without a file {len(self.missing_files)}"
            f"; skipped {sum(self.skipped.counts.values())} links/special entries"
            f"; unreadable containers {len(self.broken_containers)}"
        )

    def empty_classes(self) -> list[ClassInfo]:
        """Classes that kept no image (their label is kept: labels are positions among all class folders)."""
        return [c for c in self.classes if not self.per_class[c.wnid]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "layout": self.layout,
            "source": self.source,
            "summary": self.summary_line(),
            "candidates": self.candidates,
            "kept": self.accepted,
            "per_split": dict(sorted(self.per_split.items())),
            "classes": len(self.classes),
            "junk_skipped": dict(sorted(self.junk.items())),
            "quarantined": self.quarantine.by_reason(),
            "label_rows_without_file": len(self.missing_files),
            "label_rows_without_file_sample": self.missing_files[:100],
            "skipped": self.skipped.to_dict(),
            "unreadable_containers": self.broken_containers,
            "empty_classes": [{"wnid": c.wnid, "label": c.index} for c in self.empty_classes()],
            "warnings": self.warnings,
        }


def junk_kind(name: str) -> str | None:
    """Why a directory entry is not a candidate image, or None if it is one."""
    if name.lower() in SYSTEM_FILES:
        return "system-file"
    if name.startswith("."):
        return "hidden"
    if os.path.splitext(name)[1].lower() not in IMAGE_EXTENSIONS:
        return "non-image-extension"
    return None
