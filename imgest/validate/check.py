"""The xNVMe validation check: four read engines feed the same DALI pipeline; every byte and label read is checked.

For each engine and split, one verifying pass hashes each sample as DALI hands it over and compares it with the
sha256 recorded at ingest, and its label with the one ``fn.readers.file`` assigned to the same path; then ROUNDS
timed passes (time spent inside ``pipe.run()``, no hashing) give img/s and MB/s. No image's bytes are kept past its
batch: what each engine found is one flag byte per image (``EngineResult.outcomes``), and only the first
``LISTED`` failures are listed by path. An engine that cannot run here is skipped with the reason.
"""

from __future__ import annotations

import hashlib
import logging
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from imgest.core import defaults
from imgest.core.errors import ImgestError
from imgest.validate.cache import evict
from imgest.validate.dataset import SplitView, load_splits
from imgest.validate.pipeline import external_pipeline, reference_pipeline, run_batches, samples_of

log = logging.getLogger(__name__)
Advance = Callable[[int], None]

READ, BAD_BYTES, BAD_LABEL = 1, 2, 4  # flags per image in EngineResult.outcomes
LISTED = 100  # failures listed by path per engine and kind; the counts cover every image


class ValidationError(ImgestError):
    """The stored data did not read back byte-exact with the right labels."""


@dataclass(frozen=True)
class CheckConfig:
    """The knobs of one check; every engine runs at the same batch size.

    SAMPLE images of each split are checked, a seeded (SEED) class-balanced sample; 0 checks every image. COLD
    times every pass with the images (and EVICT_ALSO) dropped from the page cache first: the device answers.
    """

    batch_size: int = defaults.XNVME_BATCH_SIZE
    queue_depth: int = defaults.XNVME_QUEUE_DEPTH
    file_queue_depth: int = defaults.XNVME_FILE_QUEUE_DEPTH
    file_chunk: int = defaults.XNVME_FILE_CHUNK
    rounds: int = defaults.XNVME_ROUNDS
    num_threads: int = defaults.XNVME_THREADS
    decode: bool = False
    engines: tuple[str, ...] = defaults.XNVME_ENGINES
    splits: tuple[str, ...] | None = None
    sample: int = defaults.CHECK_SAMPLE
    seed: int = defaults.CHECK_SAMPLE_SEED
    cold: bool = False  # drop the checked images' cached pages before every timed pass (validate.cache)
    evict_also: tuple[str, ...] = ()  # files dropped with them when cold: a loop filesystem's image


@dataclass
class EngineResult:
    """What one engine read, how fast, and what did not match.

    ``outcomes`` holds per split one uint8 per image (READ | BAD_BYTES | BAD_LABEL); ``mismatched`` and
    ``label_mismatched`` count every failure, ``mismatches`` and ``label_mismatches`` list the first LISTED.
    """

    engine: str
    status: str = "ok"  # ok | failed | skipped
    reason: str | None = None
    images: int = 0
    nbytes: int = 0
    seconds: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    mismatches: list[dict[str, str]] = field(default_factory=list)
    label_mismatches: list[dict[str, Any]] = field(default_factory=list)
    mismatched: int = 0
    label_mismatched: int = 0
    outcomes: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def img_s(self) -> float | None:
        """Images per second inside the pipeline (None when skipped)."""
        return self.images / self.seconds if self.seconds > 0 else None

    @property
    def mb_s(self) -> float | None:
        """Megabytes (10^6) per second inside the pipeline."""
        return self.nbytes / self.seconds / 1e6 if self.seconds > 0 else None

    @property
    def checked(self) -> int:
        """Images whose bytes this engine read and hashed in its verifying pass."""
        return int(sum(np.count_nonzero(o & READ) for o in self.outcomes.values()))

    def add_mismatch(self, entry: dict[str, str]) -> None:
        """Count a wrong or unread image; list it while fewer than LISTED are."""
        self.mismatched += 1
        if len(self.mismatches) < LISTED:
            self.mismatches.append(entry)

    def add_label_mismatch(self, entry: dict[str, Any]) -> None:
        """Count a wrong label; list it while fewer than LISTED are."""
        self.label_mismatched += 1
        if len(self.label_mismatches) < LISTED:
            self.label_mismatches.append(entry)


def verify_batch(
    result: EngineResult,
    split: SplitView,
    outcome: np.ndarray,
    index: Sequence[int],
    data: Sequence[bytes],
    labels: Sequence[int],
    reader_labels: Sequence[int],
) -> None:
    """Check one batch: the images at INDEX of SPLIT read as DATA, with LABELS (the ones we assign) against
    READER_LABELS (the ones fn.readers.file assigns; -1: unknown). Flags go into OUTCOME, failures into RESULT;
    an image already flagged read (DALI pads the last batch) is not checked twice."""
    for i, blob, label, reader_label in zip(index, data, labels, reader_labels, strict=True):
        if i < 0 or outcome[i] & READ:
            continue
        flags = READ
        digest = hashlib.sha256(blob).digest()
        if not split.recorded[i] or digest != split.sha256[i].tobytes():
            flags |= BAD_BYTES
            expected = split.sha256[i].tobytes().hex() if split.recorded[i] else "not recorded"
            result.add_mismatch(
                {"engine": result.engine, "path": split.path(i), "expected": expected, "actual": digest.hex()}
            )
        if reader_label >= 0 and label != reader_label:
            flags |= BAD_LABEL
            result.add_label_mismatch(
                {"engine": result.engine, "path": split.path(i), "label": int(label), "reader_label": int(reader_label)}
            )
        outcome[i] = flags


@dataclass
class Verifier:
    """What a verifying pass writes to: the engine's result, the split's outcome flags and the reference labels
    (filled by the reference pass, read by the others)."""

    result: EngineResult
    outcome: np.ndarray
    reader_labels: np.ndarray


def reference_pass(split: SplitView, cfg: CheckConfig, advance: Advance, verify: Verifier | None = None) -> float:
    """One pass of fn.readers.file over the split's images; with VERIFY each image is checked as it arrives.
    Returns the seconds in run()."""
    n = len(split)
    pipe = reference_pipeline(split.reader_dir or split.split_dir, cfg.batch_size, cfg.num_threads, cfg.decode)
    seconds = 0.0
    for dt, outputs in run_batches(pipe, -(-n // cfg.batch_size)):
        seconds += dt
        if verify is not None:
            data, dali_labels, infos = zip(*samples_of(outputs), strict=True)
            index = split.index_of([f"{split.split}/{info}" for info in infos])
            known = index >= 0
            if not known.all():
                log.warning("fn.readers.file read %d files of %s not among the images checked", (~known).sum(), split)
            fresh = [j for j, i in enumerate(index) if i >= 0 and verify.reader_labels[i] < 0]
            verify.reader_labels[index[fresh]] = np.asarray(dali_labels, np.int32)[fresh]
            ours = [int(split.labels[i]) if i >= 0 else -1 for i in index]
            verify_batch(verify.result, split, verify.outcome, index, data, ours, dali_labels)
        advance(min(cfg.batch_size, n))
    return seconds


def external_pass(
    read: Any, split: SplitView, cfg: CheckConfig, advance: Advance, verify: Verifier | None = None
) -> float:
    """One pass of fn.external_source fed by READ over the split's images in order; with VERIFY each image is
    checked as it arrives. Returns the seconds in run()."""
    pipe = external_pipeline(read, lambda: split.batches(cfg.batch_size), cfg.batch_size, cfg.num_threads, cfg.decode)
    seconds = 0.0
    done = 0
    for dt, outputs in run_batches(pipe, None):
        seconds += dt
        batch = list(samples_of(outputs))
        if verify is not None:
            index = np.arange(done, done + len(batch))
            data, labels, _ = zip(*batch, strict=True)
            verify_batch(verify.result, split, verify.outcome, index, data, labels, verify.reader_labels[index])
        done += len(batch)
        advance(len(batch))
    return seconds


def make_cold(split: SplitView, cfg: CheckConfig) -> None:
    """With CFG.cold, drop SPLIT's images (and CFG.evict_also) from the page cache before a timed pass."""
    if cfg.cold:
        evict([*(split.root / rel for rel in split.iter_paths()), *cfg.evict_also])


def run_engine(
    name: str,
    read: Any,
    splits: list[SplitView],
    cfg: CheckConfig,
    reader_labels: dict[str, np.ndarray],
    advance: Advance,
) -> EngineResult:
    """Verify then time one engine over every split (READ is None for the reference reader, which fills
    READER_LABELS per split; the other engines check their labels against it)."""
    result = EngineResult(name)
    for split in splits:
        outcome = np.zeros(len(split), np.uint8)
        labels = reader_labels.setdefault(split.split, np.full(len(split), -1, np.int32))
        verify = Verifier(result, outcome, labels)
        passes = []
        for round_ in range(1 + cfg.rounds):
            check = verify if round_ == 0 else None
            if round_ > 0:
                make_cold(split, cfg)
            if read is None:
                seconds = reference_pass(split, cfg, advance, check)
            else:
                seconds = external_pass(read, split, cfg, advance, check)
            if round_ > 0:
                passes.append(seconds)
            if round_ == cfg.rounds:
                result.images += len(split)
                result.nbytes += split.nbytes
                result.seconds += statistics.median(passes) if passes else seconds
        unread = np.flatnonzero((outcome & READ) == 0)
        for i in unread[:LISTED]:
            result.add_mismatch({"engine": name, "path": split.path(i), "expected": "present", "actual": "not read"})
        result.mismatched += max(0, len(unread) - LISTED)
        result.outcomes[split.split] = outcome
    if result.mismatched or result.label_mismatched:
        result.status = "failed"
    return result


def load(root: Path, cfg: CheckConfig) -> list[SplitView]:
    """The images to check (CFG.sample of each split, seeded), or ValidationError when there is nothing to read."""
    splits = load_splits(root, list(cfg.splits) if cfg.splits else None, cfg.sample, cfg.seed)
    splits = [s for s in splits if len(s)]
    if not splits:
        raise ValidationError(f"{root} holds no samples{f' in splits {cfg.splits}' if cfg.splits else ''}")
    return splits
