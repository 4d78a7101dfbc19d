"""Candidate -> stored bytes, one batch at a time: what every sink (Cassandra, shards, check) runs."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from imgest.manifest import Candidate
from imgest.quarantine import BadImage, QuarantineEntry, QuarantineLog
from imgest.source import DEFAULT_MAX_FILE_BYTES, read_candidate
from imgest.transform import Transformed, TransformSpec, transform_image

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Processed:
    """A candidate that passed, with the bytes to store."""

    candidate: Candidate
    image: Transformed


def process_candidates(
    candidates: Iterable[Candidate],
    root: Path,
    spec: TransformSpec,
    quarantine: QuarantineLog,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> Iterator[Processed]:
    """Read and transform each candidate; a bad one is recorded in QUARANTINE and the batch goes on."""
    for cand in candidates:
        try:
            image = transform_image(read_candidate(root, cand, max_file_bytes), spec)
        except BadImage as bad:
            log.debug("quarantined %s: %s", cand.rel_path, bad)
            quarantine.add(QuarantineEntry(cand.rel_path, cand.split, bad.reason, bad.detail, cand.id))
            continue
        yield Processed(cand, image)
