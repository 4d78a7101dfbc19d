"""A source file's content hash, as a refresh records it in the baseline (``src_sha256``): what tells a changed
file from a touched one."""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from imgest.core.quarantine import BadImage
from imgest.sources.manifest import Candidate
from imgest.sources.read import read_candidate

HASH_COLUMN = "src_sha256"


MISSING_HASH = ""  # a file that vanished or could not be read while hashing: ingest quarantines it


def hash_candidates(root: Path, cands: list[Candidate], workers: int = 4) -> list[str]:
    """Source sha256 of each candidate (hashlib releases the GIL: threads overlap reading and hashing)."""

    def one(cand: Candidate) -> str:
        try:
            return hashlib.sha256(read_candidate(root, cand)).hexdigest()
        except BadImage:
            return MISSING_HASH

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, cands))
