"""`imgest check`: run the transform over a whole manifest locally and reconcile the counts.

It is the same per-image code the Spark jobs run, on a process pool, without storing anything: a dry run
that finds every corrupt, empty, non-image or over-sized file before an ingest.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imgest.core import workdir
from imgest.core.quarantine import QuarantineLog
from imgest.sources.manifest import Candidate, chunked, iter_manifest, manifest_metadata
from imgest.transform.image import TransformSpec
from imgest.transform.pipeline import process_candidates

log = logging.getLogger(__name__)
CHUNK = 64


@dataclass(frozen=True)
class ChunkResult:
    passed: int
    bytes_in: int
    bytes_out: int
    quarantine: QuarantineLog


def _check_chunk(root: str, spec: TransformSpec, chunk: list[Candidate]) -> ChunkResult:
    quarantine = QuarantineLog()
    passed = bytes_out = 0
    for item in process_candidates(chunk, Path(root), spec, quarantine):
        passed += 1
        bytes_out += len(item.image.data)
    return ChunkResult(passed, sum(c.size for c in chunk), bytes_out, quarantine)


@dataclass
class _Totals:
    rows: int = 0
    passed: int = 0
    bytes_in: int = 0
    bytes_out: int = 0

    def add(self, result: ChunkResult, quarantine: QuarantineLog) -> int:
        quarantine.extend(result.quarantine)
        n = result.passed + len(result.quarantine)
        self.rows += n
        self.passed += result.passed
        self.bytes_in += result.bytes_in
        self.bytes_out += result.bytes_out
        return n


def check_dataset(
    manifest_dir: Path, spec: TransformSpec, workers: int = 2, on_progress: Callable[[int], None] | None = None
) -> dict[str, Any]:
    """Transform every manifest row; write manifest_dir/check.json; return it."""
    meta = manifest_metadata(manifest_dir / workdir.MANIFEST)
    quarantine = QuarantineLog.read(manifest_dir / workdir.SCAN_QUARANTINE)
    scan_quarantined = len(quarantine)
    totals = _Totals()
    t0 = time.monotonic()
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
        pending: deque[Future[ChunkResult]] = deque()
        for chunk in chunked(iter_manifest(manifest_dir / workdir.MANIFEST), CHUNK):
            pending.append(pool.submit(_check_chunk, meta["root"], spec, chunk))
            while len(pending) >= workers * 4 or (pending and pending[0].done()):  # bounded in flight
                done = totals.add(pending.popleft().result(), quarantine)
                if on_progress:
                    on_progress(done)
        while pending:
            done = totals.add(pending.popleft().result(), quarantine)
            if on_progress:
                on_progress(done)
    seconds = time.monotonic() - t0
    report = quarantine.to_dict(totals.rows + scan_quarantined, totals.passed, verb="passed")
    report.update(
        {
            "dataset": meta.get("dataset"),
            "transform": spec.as_dict(),
            "seconds": round(seconds, 3),
            "images_per_s": round(totals.rows / seconds, 1) if seconds else None,
            "bytes_in": totals.bytes_in,
            "bytes_out": totals.bytes_out,
        }
    )
    (manifest_dir / workdir.CHECK_REPORT).write_text(json.dumps(report, indent=2) + "\n")
    return report
