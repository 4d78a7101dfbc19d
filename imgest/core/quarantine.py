"""Bad input is recorded, never dropped: reasons, entries, and the reconciled summary."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from imgest.core.errors import ImgestError


class Reason(StrEnum):
    """Machine-readable reasons a candidate image is quarantined."""

    EMPTY = "empty"
    NOT_AN_IMAGE = "not-an-image"
    CORRUPT = "corrupt"
    TOO_LARGE = "too-large"
    NO_LABEL = "no-label"
    TOO_LARGE_FOR_STORE = "too-large-for-store"
    MISSING = "missing"


class BadImage(ImgestError):
    """A candidate that cannot be stored; carries its quarantine reason."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class QuarantineEntry:
    """One quarantined candidate: where it is and why it was not stored."""

    path: str
    split: str
    reason: str
    detail: str
    id: str | None = None


@dataclass
class QuarantineLog:
    """Collects entries; counts reconcile as candidates = stored + quarantined."""

    entries: list[QuarantineEntry] = field(default_factory=list)

    def add(self, entry: QuarantineEntry) -> None:
        self.entries.append(entry)

    def extend(self, other: QuarantineLog) -> None:
        self.entries.extend(other.entries)

    def by_reason(self) -> dict[str, int]:
        return dict(sorted(Counter(e.reason for e in self.entries).items()))

    def __len__(self) -> int:
        return len(self.entries)

    def summary_line(self, candidates: int, stored: int, verb: str = "stored") -> str:
        """'quarantined 3 of 120 candidates (stored 117): corrupt=1 empty=2'."""
        reasons = " ".join(f"{r}={n}" for r, n in self.by_reason().items()) or "none"
        return f"quarantined {len(self)} of {candidates} candidates ({verb} {stored}): {reasons}"

    def to_dict(self, candidates: int, stored: int, verb: str = "stored") -> dict[str, Any]:
        if candidates != stored + len(self):
            raise ImgestError(
                f"counts do not reconcile: {candidates} candidates != {stored} stored + {len(self)} quarantined"
            )
        return {
            "summary": self.summary_line(candidates, stored, verb),
            "candidates": candidates,
            verb: stored,
            "quarantined": len(self),
            "by_reason": self.by_reason(),
            "entries": [asdict(e) for e in sorted(self.entries, key=lambda e: (e.split, e.path))],
        }

    def write(self, path: Path, candidates: int, stored: int, verb: str = "stored") -> dict[str, Any]:
        """Write the JSON report (sorted, so reruns give the same file); returns it."""
        report = self.to_dict(candidates, stored, verb)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
        return report

    @classmethod
    def read(cls, path: Path) -> QuarantineLog:
        data = json.loads(path.read_text())
        return cls([QuarantineEntry(**e) for e in data["entries"]])


def quarantine_summary(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The quarantine section of a published manifest: count, count by reason, entries sorted by path."""
    from collections import Counter

    return {
        "count": len(entries),
        "by_reason": dict(sorted(Counter(q["reason"] for q in entries).items())),
        "entries": sorted(entries, key=lambda q: q["path"]),
    }
