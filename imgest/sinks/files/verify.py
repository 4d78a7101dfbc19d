"""Verify a published files dataset: counts, every listed file present with its size, sha256 of a sample (or all).

samples.parquet of the version DEST/manifest.json names is streamed in batches. For each batch the rows per
split are counted (compared with the manifest at the end) and every listed file is ``stat``-ed in a thread pool:
missing files and files whose size differs from the recorded one are listed. A seeded, class-balanced sample of
each split (``imgest.core.sampling.BalancedSample``, the sampler of the read-back and xNVMe checks) is then read
and hashed against the recorded sha256. Sample 0 (``--full``) hashes every file instead, a batch at a time, in
the thread pool.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from imgest.core import defaults, workdir
from imgest.core.errors import ImgestError
from imgest.core.sampling import BalancedSample, Columns, SampleReport
from imgest.sinks.files.layout import data_root, read_manifest

log = logging.getLogger(__name__)
BATCH = 16_384  # samples.parquet rows checked at a time
THREADS = 8  # stat / read calls in flight
LISTED = 20  # problems of each kind listed in the report's dict
KEPT = 1000  # problems of each kind the report object keeps (all are counted)
_HASH_BLOCK = 1 << 20


class FilesVerificationError(ImgestError):
    """A published files dataset does not match its manifest."""


@dataclass
class FilesVerifyReport:
    """What verify_files found. ``files`` / ``bytes``: listed files present and their sizes now; ``hashed``: files
    whose sha256 was computed (the sample, or every file when ``full``). The lists keep the first KEPT problems
    of each kind; the ``*_count`` fields count them all."""

    root: str
    files: int = 0
    bytes: int = 0
    missing: list[str] = field(default_factory=list)
    mismatched: list[dict[str, str]] = field(default_factory=list)  # path, expected and actual sha256
    count_mismatches: dict[str, tuple[int, int]] = field(default_factory=dict)  # split -> (manifest, samples.parquet)
    size_mismatches: list[dict[str, Any]] = field(default_factory=list)  # path, expected and actual bytes
    version_root: str = ""  # the version folder the manifest names
    rows: int = 0  # rows of samples.parquet
    sample: int = 0  # requested images per split (0: every file)
    sample_seed: int = defaults.CHECK_SAMPLE_SEED
    hashed: int = 0
    full: bool = False
    samples: dict[str, dict[str, Any]] = field(default_factory=dict)  # split -> what was hashed of it
    missing_count: int = 0
    size_mismatch_count: int = 0
    mismatch_count: int = 0

    @property
    def ok(self) -> bool:
        problems = self.missing_count + self.size_mismatch_count + self.mismatch_count
        return not (problems or self.missing or self.mismatched or self.count_mismatches or self.size_mismatches)

    def add_missing(self, path: str) -> None:
        self.missing_count += 1
        if len(self.missing) < KEPT:
            self.missing.append(path)

    def add_size_mismatch(self, path: str, expected: int, actual: int) -> None:
        self.size_mismatch_count += 1
        if len(self.size_mismatches) < KEPT:
            self.size_mismatches.append({"path": path, "expected": expected, "actual": actual})

    def add_mismatch(self, path: str, expected: str, actual: str) -> None:
        self.mismatch_count += 1
        if len(self.mismatched) < KEPT:
            self.mismatched.append({"path": path, "expected": expected, "actual": actual})

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "root": self.root,
            "version_root": self.version_root,
            "rows": self.rows,
            "files": self.files,
            "bytes": self.bytes,
            "sample": self.sample,
            "sample_seed": self.sample_seed,
            "hashed": self.hashed,
            "full": self.full,
            "missing": self.missing[:LISTED],
            "missing_count": self.missing_count,
            "size_mismatches": self.size_mismatches[:LISTED],
            "size_mismatch_count": self.size_mismatch_count,
            "mismatched": self.mismatched[:LISTED],
            "mismatch_count": self.mismatch_count,
            "count_mismatches": self.count_mismatches,
            "samples": self.samples,
        }

    def summary(self) -> str:
        """One line: what was checked and how."""
        how = "every file hashed" if self.full else f"a sample of {self.hashed} files hashed (seed {self.sample_seed})"
        return f"{self.files} of {self.rows} listed files present with their size; {how}"


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return -1


def _sha256(path: str) -> str | None:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            while block := fh.read(_HASH_BLOCK):
                digest.update(block)
    except FileNotFoundError:
        return None
    return digest.hexdigest()


def _batches(samples: Path) -> Iterator[Any]:
    import pyarrow.parquet as pq

    columns = ["id", "path", "label", "split", "bytes", "sha256"]
    yield from pq.ParquetFile(samples).iter_batches(batch_size=BATCH, columns=columns)


def _columns(batch: Any) -> dict[str, np.ndarray]:
    def text(name: str) -> np.ndarray:
        values = [str(v).encode() for v in batch.column(name).to_pylist()]
        return np.array(values, dtype="S") if values else np.zeros(0, "S1")

    return {
        "id": text("id"),
        "label": batch.column("label").to_numpy(zero_copy_only=False).astype(np.int32),
        "path": text("path"),
        "sha256": text("sha256"),
        "nbytes": batch.column("bytes").fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64),
        "split": text("split"),
    }


def _empty() -> Columns:
    return {
        "id": np.zeros(0, "S1"),
        "label": np.zeros(0, np.int32),
        "path": np.zeros(0, "S1"),
        "sha256": np.zeros(0, "S1"),
        "nbytes": np.zeros(0, np.int64),
        "size": np.zeros(0, np.int64),
    }


class _Checker:
    """Stats (and, in full mode, hashes) the files of a batch in a thread pool; adds what it finds to REPORT."""

    def __init__(self, root: Path, report: FilesVerifyReport, pool: ThreadPoolExecutor) -> None:
        self.root, self.report, self.pool = root, report, pool

    def stat(self, cols: Columns) -> None:
        """Each file's size now into COLS["size"] (-1: missing); reports missing files and size changes."""
        paths = [str(self.root / p.decode()) for p in cols["path"].tolist()]
        sizes = np.fromiter(self.pool.map(_size, paths), np.int64, len(paths))
        for i in np.flatnonzero(sizes < 0).tolist():
            self.report.add_missing(cols["path"][i].decode())
        for i in np.flatnonzero((sizes >= 0) & (sizes != cols["nbytes"])).tolist():
            self.report.add_size_mismatch(cols["path"][i].decode(), int(cols["nbytes"][i]), int(sizes[i]))
        present = sizes >= 0
        self.report.files += int(present.sum())
        self.report.bytes += int(sizes[present].sum())
        cols["size"] = sizes

    def hash(self, cols: Columns) -> None:
        """sha256 of each file of COLS present at stat time against the recorded one (one gone since: missing)."""
        todo = np.flatnonzero(cols["size"] >= 0).tolist()
        paths = [str(self.root / cols["path"][i].decode()) for i in todo]
        for i, actual in zip(todo, self.pool.map(_sha256, paths), strict=True):
            rel = cols["path"][i].decode()
            if actual is None:
                self.report.add_missing(rel)
                continue
            self.report.hashed += 1
            expected = cols["sha256"][i].decode()
            if actual != expected:
                self.report.add_mismatch(rel, expected, actual)


def verify_files(
    root: Path, sample: int = defaults.CHECK_SAMPLE, seed: int = defaults.CHECK_SAMPLE_SEED, threads: int = THREADS
) -> FilesVerifyReport:
    """Check the files dataset under ROOT: rows per split of samples.parquet against manifest.json, every listed
    file present with its recorded size, and the sha256 of a seeded, class-balanced SAMPLE of each split's files
    (every file when SAMPLE is 0). Never raises for a mismatch: the report lists them (``ok``)."""
    manifest = read_manifest(root)
    version = data_root(root, manifest)
    report = FilesVerifyReport(str(root), version_root=str(version), sample=max(0, sample), sample_seed=seed)
    report.full = report.sample == 0
    per_split: Counter[str] = Counter()
    pickers: dict[str, BalancedSample] = {}
    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="verify-files") as pool:
        check = _Checker(version, report, pool)
        for batch in _batches(version / workdir.PUBLISHED_SAMPLES):
            cols = _columns(batch)
            splits = cols.pop("split")
            report.rows += len(splits)
            per_split.update(s.decode() for s in splits.tolist())
            check.stat(cols)
            if report.full:
                check.hash(cols)
                continue
            for split in np.unique(splits).tolist():
                picker = pickers.setdefault(split.decode(), BalancedSample(report.sample, seed, _empty()))
                picker.add({k: v[splits == split] for k, v in cols.items()})
        for split, picker in sorted(pickers.items()):
            rows, sampled = picker.result()
            check.hash(rows)
            report.samples[split] = _sample_dict(sampled)
        report.full = report.full or all(s["full_read"] for s in report.samples.values())  # the sample was all
    for split in sorted(set(manifest.get("samples", {})) | set(per_split)):
        expected = int(manifest.get("samples", {}).get(split, 0))
        if expected != per_split[split]:
            report.count_mismatches[split] = (expected, per_split[split])
    log.info("verified %s: %s", root, report.summary())
    return report


def _sample_dict(sampled: SampleReport) -> dict[str, Any]:
    """What part of one split was hashed and how balanced (per-class counts left out: a summary)."""
    b = sampled.balance
    return {
        "split_rows": sampled.total,
        "checked": sampled.checked,
        "full_read": sampled.full,
        "classes": b["classes"],
        "per_class_min": b["per_class_min"],
        "per_class_max": b["per_class_max"],
    }
