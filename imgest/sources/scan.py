"""Scanning a source into the work folder: manifest.parquet, classes.json, quarantine.json, scan_report.json.

The scan picks its scanner through a small registry (``SCANNERS``: a test of the source and the scanner it
takes); the scanners (imgest.sources.scanner for folders and tars, imgest.sources.s3scan for ``s3://`` URLs)
share imgest.sources.scanbase and never import this module.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from imgest.core import workdir
from imgest.core.errors import NothingIngestibleError
from imgest.sources.manifest import Candidate
from imgest.sources.s3source import is_s3
from imgest.sources.scanbase import ScanReport
from imgest.sources.scanner import Scanner

log = logging.getLogger(__name__)


def _s3_scanner(
    src: Path | str, out: Path, layout: str, dataset: str | None, flat_split: str, follow_external_links: bool
) -> Any:
    from imgest.sources.s3scan import SOURCE_CACHE, S3Scanner

    return S3Scanner(str(src), layout, dataset, flat_split, cache_dir=out / SOURCE_CACHE)


def _local_scanner(
    src: Path | str, out: Path, layout: str, dataset: str | None, flat_split: str, follow_external_links: bool
) -> Any:
    return Scanner(src, layout, dataset, flat_split, follow_external_links)


# (does this scanner read SRC?, the scanner for SRC): the first match scans; the local one takes the rest.
SCANNERS: list[tuple[Callable[[Path | str], bool], Callable[..., Any]]] = [
    (is_s3, _s3_scanner),
    (lambda src: True, _local_scanner),
]


def scan_to_dir(
    src: Path | str,
    out: Path,
    layout: str = "auto",
    dataset: str | None = None,
    flat_split: str = "train",
    on_candidate: Any = None,
    follow_external_links: bool = False,
) -> ScanReport:
    """Scan SRC (a folder, a tar, or an ``s3://`` URL) and write OUT/manifest.parquet, classes.json,
    quarantine.json and scan_report.json.

    Raises NothingIngestibleError (after writing those files) when no candidate was kept.
    """
    import json

    from imgest.sources.manifest import write_classes, write_manifest

    open_scanner = next(make for matches, make in SCANNERS if matches(src))
    scanner = open_scanner(src, out, layout, dataset, flat_split, follow_external_links)
    candidates = scanner.candidates()
    if on_candidate is not None:
        candidates = _tap(candidates, on_candidate)
    root = scanner._root
    meta = {"dataset": scanner.dataset, "layout": scanner.layout, "root": str(root)}
    write_manifest(candidates, out / workdir.MANIFEST, meta)
    report = scanner.report
    write_classes(report.classes, out / workdir.CLASSES)
    report.quarantine.write(out / workdir.SCAN_QUARANTINE, report.candidates, report.accepted, verb="kept")
    (out / workdir.SCAN_REPORT).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    for warning in report.warnings:
        log.warning("%s", warning)
    if report.accepted == 0:
        raise NothingIngestibleError(
            f"nothing is ingestible in {scanner.src}: 0 of {report.candidates} candidates kept "
            f"({report.quarantine.summary_line(report.candidates, 0, 'kept')}); quarantine list: "
            f"{out / workdir.SCAN_QUARANTINE}, skipped entries: {out / workdir.SCAN_REPORT}"
        )
    return report


def _tap(items: Iterator[Candidate], callback: Any) -> Iterator[Candidate]:
    for item in items:
        callback(item)
        yield item
