"""Verify a published files dataset: every file listed is there with its size and sha256; counts match."""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imgest.core.errors import ImgestError
from imgest.sinks.files.layout import iter_files, read_manifest


class FilesVerificationError(ImgestError):
    """A published files dataset does not match its manifest."""


@dataclass
class FilesVerifyReport:
    """What verify_files found."""

    root: str
    files: int = 0
    bytes: int = 0
    missing: list[str] = field(default_factory=list)
    mismatched: list[dict[str, str]] = field(default_factory=list)  # path, expected and actual sha256
    count_mismatches: dict[str, tuple[int, int]] = field(default_factory=dict)  # split -> (manifest, files)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.mismatched or self.count_mismatches)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "root": self.root,
            "files": self.files,
            "bytes": self.bytes,
            "missing": self.missing[:20],
            "mismatched": self.mismatched[:20],
            "count_mismatches": self.count_mismatches,
        }


def verify_files(root: Path) -> FilesVerifyReport:
    """Hash every file of the dataset under ROOT against samples.parquet; compare counts with manifest.json."""
    manifest = read_manifest(root)
    report = FilesVerifyReport(str(root))
    per_split: Counter[str] = Counter()
    for f in iter_files(root):
        path = root / f.path
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            report.missing.append(f.path)
            continue
        actual = hashlib.sha256(data).hexdigest()
        if actual != f.sha256:
            report.mismatched.append({"path": f.path, "expected": f.sha256, "actual": actual})
        report.files += 1
        report.bytes += len(data)
        per_split[f.split] += 1
    for split in sorted(set(manifest["samples"]) | set(per_split)):
        expected = int(manifest["samples"].get(split, 0))
        if expected != per_split[split]:
            report.count_mismatches[split] = (expected, per_split[split])
    return report
