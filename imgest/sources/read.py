"""Reading a candidate's bytes from a folder tree or from inside a tar, by the manifest's coordinates."""

from __future__ import annotations

from pathlib import Path

from imgest.core.quarantine import BadImage, Reason
from imgest.sources.manifest import Candidate

DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024


def read_candidate(root: Path, cand: Candidate, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> bytes:
    """The encoded bytes of CAND under ROOT; a vanished or over-sized file raises BadImage."""
    if cand.size > max_bytes:
        raise BadImage(Reason.TOO_LARGE, f"{cand.size} bytes > file limit {max_bytes}")
    try:
        if cand.container:
            with open(root / cand.container, "rb") as fh:
                fh.seek(cand.offset)
                data = fh.read(cand.size)
            if len(data) != cand.size:
                raise BadImage(Reason.CORRUPT, f"tar {cand.container} ends {cand.size - len(data)} bytes early")
            return data
        return (root / cand.rel_path).read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        raise BadImage(Reason.MISSING, f"{root / (cand.container or cand.rel_path)} vanished since the scan") from None
