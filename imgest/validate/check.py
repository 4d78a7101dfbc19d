"""The xNVMe validation check: four read engines feed the same DALI pipeline; every byte and label is checked.

For each engine and split, one verifying pass hashes every sample DALI hands over and compares it with the sha256
recorded at ingest, and its label with the one ``fn.readers.file`` assigned to the same path; then ROUNDS timed
passes (time spent inside ``pipe.run()``, no hashing) give img/s and MB/s. An engine that cannot run here is
skipped with the reason.
"""

from __future__ import annotations

import hashlib
import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imgest.core import defaults
from imgest.core.errors import ImgestError
from imgest.validate.dataset import SplitView, load_splits
from imgest.validate.pipeline import external_pipeline, reference_pipeline, run_batches, samples_of

log = logging.getLogger(__name__)
Advance = Callable[[int], None]


class ValidationError(ImgestError):
    """The stored data did not read back byte-exact with the right labels."""


@dataclass(frozen=True)
class CheckConfig:
    """The knobs of one check; every engine runs at the same batch size."""

    batch_size: int = defaults.XNVME_BATCH_SIZE
    queue_depth: int = defaults.XNVME_QUEUE_DEPTH
    file_queue_depth: int = defaults.XNVME_FILE_QUEUE_DEPTH
    file_chunk: int = defaults.XNVME_FILE_CHUNK
    rounds: int = defaults.XNVME_ROUNDS
    num_threads: int = defaults.XNVME_THREADS
    decode: bool = False
    engines: tuple[str, ...] = defaults.XNVME_ENGINES
    splits: tuple[str, ...] | None = None


@dataclass
class EngineResult:
    """What one engine read, how fast, and what did not match."""

    engine: str
    status: str = "ok"  # ok | failed | skipped
    reason: str | None = None
    images: int = 0
    nbytes: int = 0
    seconds: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    mismatches: list[dict[str, str]] = field(default_factory=list)
    label_mismatches: list[dict[str, Any]] = field(default_factory=list)

    @property
    def img_s(self) -> float | None:
        """Images per second inside the pipeline (None when skipped)."""
        return self.images / self.seconds if self.seconds > 0 else None

    @property
    def mb_s(self) -> float | None:
        """Megabytes (10^6) per second inside the pipeline."""
        return self.nbytes / self.seconds / 1e6 if self.seconds > 0 else None


def verify_outputs(
    result: EngineResult, got: list[tuple[str, bytes, int]], split: SplitView, ref_labels: dict[str, int]
) -> None:
    """Record in RESULT every sample of GOT (path, bytes, label) whose sha256 or label is not the expected one."""
    expected = {s.path: s.sha256 for s in split.samples}
    for path, data, label in got:
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected[path]:
            result.mismatches.append(
                {"engine": result.engine, "path": path, "expected": expected[path], "actual": actual}
            )
        if path in ref_labels and label != ref_labels[path]:
            result.label_mismatches.append(
                {"engine": result.engine, "path": path, "label": label, "reader_label": ref_labels[path]}
            )


def reference_pass(split: SplitView, cfg: CheckConfig, advance: Advance) -> tuple[list[tuple[str, bytes, int]], float]:
    """One pass of fn.readers.file: every sample once (path, bytes, label) and the seconds in run()."""
    n = len(split.samples)
    pipe = reference_pipeline(split.split_dir, cfg.batch_size, cfg.num_threads, cfg.decode)
    seen: dict[str, tuple[bytes, int]] = {}
    seconds = 0.0
    for dt, outputs in run_batches(pipe, -(-n // cfg.batch_size)):
        seconds += dt
        for data, label, info in samples_of(outputs):
            seen.setdefault(f"{split.split}/{info}", (data, label))
        advance(min(cfg.batch_size, n))
    return [(path, data, label) for path, (data, label) in seen.items()], seconds


def external_pass(
    read: Any, split: SplitView, cfg: CheckConfig, advance: Advance
) -> tuple[list[tuple[str, bytes, int]], float]:
    """One pass of fn.external_source fed by READ: (path, bytes, label) in sample order and the seconds in run()."""
    pipe = external_pipeline(read, split.samples, cfg.batch_size, cfg.num_threads, cfg.decode)
    got: list[tuple[str, bytes, int]] = []
    seconds = 0.0
    for dt, outputs in run_batches(pipe, None):
        seconds += dt
        batch = list(samples_of(outputs))
        for (data, label, _), sample in zip(batch, split.samples[len(got) : len(got) + len(batch)], strict=True):
            got.append((sample.path, data, label))
        advance(len(batch))
    return got, seconds


def run_engine(
    name: str, read: Any, splits: list[SplitView], cfg: CheckConfig, ref_labels: dict[str, int], advance: Advance
) -> EngineResult:
    """Verify then time one engine over every split (READ is None for the reference reader)."""
    result = EngineResult(name)
    for split in splits:
        label_of = {s.path: s.label for s in split.samples}
        passes = []
        for round_ in range(1 + cfg.rounds):
            got, seconds = (
                reference_pass(split, cfg, advance) if read is None else external_pass(read, split, cfg, advance)
            )
            if round_ == 0:
                if read is None:
                    ref_labels.update({path: label for path, _, label in got})
                    got = [(p, d, label_of[p]) for p, d, _ in got if p in label_of]  # our labels vs the reader's
                missing = {s.path for s in split.samples} - {path for path, _, _ in got}
                result.mismatches.extend(
                    {"engine": name, "path": p, "expected": "present", "actual": "not read"} for p in sorted(missing)
                )
                verify_outputs(result, got, split, ref_labels)
            else:
                passes.append(seconds)
            if round_ == cfg.rounds:
                result.images += len(split.samples)
                result.nbytes += sum(s.size for s in split.samples)
                result.seconds += statistics.median(passes) if passes else seconds
    if result.mismatches or result.label_mismatches:
        result.status = "failed"
    return result


def load(root: Path, cfg: CheckConfig) -> list[SplitView]:
    """The splits to check, or ValidationError when there is nothing to read."""
    splits = load_splits(root, list(cfg.splits) if cfg.splits else None)
    if not splits:
        raise ValidationError(f"{root} holds no samples{f' in splits {cfg.splits}' if cfg.splits else ''}")
    return splits
