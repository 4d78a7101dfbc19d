"""Reading a candidate's bytes from a folder tree or from inside a tar, by the manifest's coordinates.

ROOT may be an S3 source (``s3://bucket/prefix``, or the ``s3:/...`` that ``Path`` makes of it): the bytes then
come by GET, or by coalesced ranged GETs for a tar member (see ``imgest.sources.s3objects``).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from imgest.core.errors import ImgestError
from imgest.core.quarantine import BadImage, Reason
from imgest.sources.manifest import Candidate
from imgest.sources.s3objects import read_s3_candidate
from imgest.sources.s3source import is_s3

DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024
READ_AHEAD = 16  # objects of an S3 source requested ahead of the consumer (one GET each)
FOLLOW_GAP = 64 * 1024  # a tar member this close after the last one read is read from the archive's blocks


def read_candidate(root: Path, cand: Candidate, max_bytes: int = DEFAULT_MAX_FILE_BYTES, exact: bool = False) -> bytes:
    """The encoded bytes of CAND under ROOT; a vanished or over-sized file raises BadImage. EXACT (an S3 tar
    member): one ranged GET of the member alone."""
    if cand.size > max_bytes:
        raise BadImage(Reason.TOO_LARGE, f"{cand.size} bytes > file limit {max_bytes}")
    if is_s3(root):
        return read_s3_candidate(root, cand, exact)
    try:
        if cand.container:
            with open(root / cand.container, "rb") as fh:
                fh.seek(cand.offset)
                data = fh.read(cand.size)
            if len(data) != cand.size:
                raise BadImage(Reason.CORRUPT, f"tar {cand.container} ends {cand.size - len(data)} bytes early")
            return data
        return read_whole(f"{root}/{cand.rel_path}", cand.size)
    except (FileNotFoundError, NotADirectoryError):
        if not Path(root).is_dir():
            raise SourceNotVisibleError(root) from None
        raise BadImage(Reason.MISSING, f"{root / (cand.container or cand.rel_path)} vanished since the scan") from None


def read_whole(path: str, size: int) -> bytes:
    """The bytes of the file PATH (SIZE, as scanned, sizes the first read), read to its end: a file that grew or
    shrank since, or a filesystem that returns short reads (FUSE, network mounts), is read whole. Half the CPU of
    Path.read_bytes, whose buffered reader and path objects cost as much as the read."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        parts = [os.read(fd, size + 1)]
        while parts[-1]:
            parts.append(os.read(fd, 1 << 20))
        return parts[0] if len(parts) == 2 else b"".join(parts)
    finally:
        os.close(fd)


class SourceNotVisibleError(ImgestError):
    """The source folder the scan saw is not on the host that must read it: every image would be lost, so the job
    fails (never a quarantine of every file as MISSING)."""

    def __init__(self, root: Path) -> None:
        import socket

        super().__init__(
            f"source folder {root} does not exist on host {socket.gethostname()}, which must read it: a local source "
            "must be on storage every Spark node mounts at the same path; or put the source on S3 (s3://...)"
        )


def _read_or_bad(root: Path, cand: Candidate, max_bytes: int, exact: bool = False) -> bytes | BadImage:
    try:
        return read_candidate(root, cand, max_bytes, exact)
    except BadImage as bad:
        return bad


def _follows(before: tuple[str, int] | None, cand: Candidate) -> bool:
    """Whether tar member CAND starts where the member read before it ended, or shortly after (same archive)."""
    return before is not None and before[0] == cand.container and 0 <= cand.offset - before[1] <= FOLLOW_GAP


def read_ahead(
    root: Path, cands: Iterable[Candidate], depth: int = READ_AHEAD, max_bytes: int = DEFAULT_MAX_FILE_BYTES
) -> Iterator[tuple[Candidate, bytes | BadImage]]:
    """Each of CANDS, in order, with its bytes or the BadImage reading them raised (other errors propagate).

    For an S3 root DEPTH objects are requested ahead of the consumer, so the round trip of each GET overlaps the
    transform of the images before it. A tar member that follows the two before it (the manifest's order) is read
    where it is consumed: its archive's reader already fetches coalesced blocks ahead (imgest.sources.s3objects).
    One that does not (a shard's shuffled members) is requested ahead like an object, by an exact ranged GET of its
    own bytes: one round trip each, DEPTH in flight, nothing fetched that is not used. A local root is read as it
    is consumed.
    """
    if not is_s3(root):
        for cand in cands:
            yield cand, _read_or_bad(root, cand, max_bytes)
        return
    with ThreadPoolExecutor(max_workers=depth, thread_name_prefix="imgest-read-ahead") as pool:
        pending: deque[tuple[Candidate, Future[bytes | BadImage]]] = deque()
        before: tuple[str, int] | None = None
        streak = 0  # members in a row that followed the one before: 2 or more is a forward stream, not chance
        for cand in cands:
            member = bool(cand.container)
            streak = streak + 1 if member and _follows(before, cand) else 0
            before = (cand.container, cand.offset + cand.size) if member else None
            if streak >= 2:
                while pending:  # keep the order
                    first, future = pending.popleft()
                    yield first, future.result()
                yield cand, _read_or_bad(root, cand, max_bytes)
                continue
            pending.append((cand, pool.submit(_read_or_bad, root, cand, max_bytes, member)))
            if len(pending) >= depth:
                first, future = pending.popleft()
                yield first, future.result()
        while pending:
            first, future = pending.popleft()
            yield first, future.result()
