"""Candidate -> stored bytes, one batch at a time: what every sink (Cassandra, shards, check) runs."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from imgest.core.quarantine import BadImage, QuarantineEntry, QuarantineLog
from imgest.sources.manifest import Candidate
from imgest.sources.read import DEFAULT_MAX_FILE_BYTES, read_ahead
from imgest.sources.tree import inside
from imgest.transform.image import Transformed, TransformSpec, transform_image

log = logging.getLogger(__name__)


OUTSIDE_DETAIL = "a link to a file outside the dataset (followed on request); its content is not recorded"


def inside_source(root: Path, cand: Candidate) -> bool:
    """True if CAND's bytes live inside the dataset under ROOT (a tar member always does)."""
    return bool(cand.container) or inside(root, root / cand.rel_path)


@dataclass(frozen=True)
class Processed:
    """A candidate that passed, with the bytes to store and the sha256 of its source bytes."""

    candidate: Candidate
    image: Transformed
    src_sha256: str
    source: bytes = b""  # the bytes read (IMAGE.data is this very object when they are stored unchanged)


def process_candidates(
    candidates: Iterable[Candidate],
    root: Path,
    spec: TransformSpec,
    quarantine: QuarantineLog,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    skip: Callable[[Candidate, str], bool] | None = None,
) -> Iterator[Processed]:
    """Read each candidate once and transform it; a bad one is recorded in QUARANTINE and the batch goes on.

    SKIP(candidate, source sha256) is asked before the transform: True means "already stored, leave it".
    """
    for cand, read in read_ahead(root, candidates, max_bytes=max_file_bytes):  # S3 GETs in flight ahead
        try:
            if isinstance(read, BadImage):
                raise read
            data = read
            src_sha256 = hashlib.sha256(data).hexdigest()
            if skip is not None and skip(cand, src_sha256):
                continue
            image = transform_image(data, spec)
        except BadImage as bad:
            log.debug("quarantined %s: %s", cand.rel_path, bad.reason)
            detail = bad.detail if inside_source(root, cand) else OUTSIDE_DETAIL
            quarantine.add(QuarantineEntry(cand.rel_path, cand.split, bad.reason, detail, cand.id))
            continue
        yield Processed(cand, image, src_sha256, data)
