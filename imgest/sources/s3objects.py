"""Reading a source that lives on S3: its connection, listings, ranged reads and tar members by offset.

A source URL is ``s3://bucket/prefix/`` (a dataset tree) or ``s3://bucket/.../ILSVRC2012_img_train.tar``. Its
connection is its own (``source_conn_id`` in the DAG; ``IMGEST_SOURCE_S3_ENDPOINT``,
``IMGEST_SOURCE_AWS_ACCESS_KEY_ID``, ``IMGEST_SOURCE_AWS_SECRET_ACCESS_KEY``, ``IMGEST_SOURCE_AWS_REGION`` for a
Spark driver or the CLI, with ``IMGEST_SOURCE_AWS_SESSION_TOKEN`` for temporary keys; unset ones fall back to
the destination's ``S3Settings.from_env``, and without keys botocore's chain signs). A Spark driver wraps
the manifest's root in a ``SourceRoot``, a string that carries those settings inside the pickled task and
registers them on the executor that unpickles it, so workers need neither the keys in their environment nor a
shared file system.

Executors read objects through an ``ObjectGetter`` (``imgest.sources.s3getter``): botocore's own SigV4 signer over
one urllib3 connection pool per process, without the boto3 client's per-call machinery.

Only GET, HEAD and LIST requests are made: nothing is ever written to the source bucket.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from imgest.core.quarantine import BadImage, Reason
from imgest.core.settings import S3Settings
from imgest.sources.manifest import Candidate
from imgest.sources.s3getter import ObjectGetter, S3RequestError, _getters, _getters_lock, getter_for
from imgest.sources.s3source import S3SourceError, forget_sources, settings_for, split_url

log = logging.getLogger(__name__)

COALESCE_BYTES = 8 * 1024 * 1024  # one ranged GET for neighbouring members (AWS's guidance: 8-16 MB requests)
IN_FLIGHT = 4  # coalesced GETs of one archive in flight ahead of the reader
FIRST_WINDOW = 64 * 1024  # a scan's first GET after a jump; doubles while reads go forward, up to COALESCE_BYTES
ARCHIVE_READERS = 2  # archives per process with read-ahead buffers (the train and the val tar)


@functools.lru_cache(maxsize=8)
def client_for(settings: S3Settings) -> Any:
    """One boto3 client per connection and process (clients are thread-safe), with room for reads in flight."""
    return settings.client(max_pool_connections=4 * IN_FLIGHT)


def _describe(exc: Exception) -> str:
    code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
    return f"{code or type(exc).__name__}: {exc}"


def forget_connections() -> None:
    """Drop this process's source connections, clients, getters and archive readers (a long-lived driver between
    jobs: the next job resolves its own)."""
    from imgest.core.bucket_region import forget_regions

    forget_sources()
    forget_regions()
    client_for.cache_clear()
    with _getters_lock:
        _getters.clear()
    with _archives_lock:
        _archives.clear()


def get_range(getter: ObjectGetter, bucket: str, key: str, start: int, end: int) -> bytes:
    """Bytes [START, END) of s3://BUCKET/KEY by one ranged GET (fewer when the object is shorter)."""
    if end <= start:
        return b""
    try:
        return getter.get(bucket, key, (start, end))
    except S3RequestError as exc:
        if exc.status == 416 or exc.code == "InvalidRange":
            return b""  # the object ends before START (it shrank since its size was read)
        raise


def head(client: Any, bucket: str, key: str) -> dict[str, Any] | None:
    """HEAD of s3://BUCKET/KEY, or None when there is no such object."""
    from botocore.exceptions import ClientError

    try:
        return dict(client.head_object(Bucket=bucket, Key=key))
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise S3SourceError(
            f"cannot read s3://{bucket}/{key}: {_describe(exc)}; check the source connection's keys and endpoint"
        ) from None


@dataclass(frozen=True)
class ListedObject:
    """One object of a listing: key, size, ETag (without quotes) and last-modified time (epoch seconds)."""

    key: str
    size: int
    etag: str
    mtime: float


def list_objects(client: Any, bucket: str, prefix: str) -> Iterator[ListedObject]:
    """Every object under PREFIX in key order, page by page (ListObjectsV2: one page of 1,000 in memory)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", ()):
                mtime = obj["LastModified"].timestamp()
                yield ListedObject(obj["Key"], int(obj["Size"]), str(obj.get("ETag", "")).strip('"'), mtime)
    except (ClientError, BotoCoreError) as exc:
        raise S3SourceError(
            f"cannot list s3://{bucket}/{prefix}: {_describe(exc)}; check the bucket and the source connection"
        ) from None


def list_level(client: Any, bucket: str, prefix: str) -> tuple[list[str], list[str]]:
    """(folder names, file names) directly under PREFIX (a delimited listing, paginated)."""
    from botocore.exceptions import BotoCoreError, ClientError

    folders: list[str] = []
    files: list[str] = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
            folders += [p["Prefix"][len(prefix) :].rstrip("/") for p in page.get("CommonPrefixes", ())]
            files += [o["Key"][len(prefix) :] for o in page.get("Contents", ())]
    except (ClientError, BotoCoreError) as exc:
        raise S3SourceError(
            f"cannot list s3://{bucket}/{prefix}: {_describe(exc)}; check the bucket and the source connection"
        ) from None
    return sorted(f for f in folders if f), sorted(f for f in files if f)


class RangedObject:
    """A read-only, seekable file over one S3 object, served by ranged GETs (what tarfile reads headers from).

    Reads that go forward grow the next GET from 64 KiB up to ``COALESCE_BYTES``; a jump starts small again, so
    walking the 1,000 class tars of the train tar costs one small GET each, and streaming a class tar's headers
    costs one GET per 8 MiB. One buffer is held: memory stays flat whatever the archive's size.
    """

    def __init__(self, getter: ObjectGetter, bucket: str, key: str, size: int) -> None:
        self.getter, self.bucket, self.key, self.name = getter, bucket, key, key
        self.size, self._pos = size, 0
        self._buf, self._buf_start, self._window = b"", 0, FIRST_WINDOW

    def _fill(self, n: int) -> None:
        end_prev = self._buf_start + len(self._buf)
        forward = end_prev <= self._pos < end_prev + 2 * self._window and self._buf
        self._window = min(COALESCE_BYTES, 2 * self._window) if forward else FIRST_WINDOW
        want = min(self.size, self._pos + max(n, self._window))
        self._buf, self._buf_start = get_range(self.getter, self.bucket, self.key, self._pos, want), self._pos

    def read(self, n: int = -1) -> bytes:
        """Up to N bytes from the current position (all that is left for N < 0)."""
        n = self.size - self._pos if n < 0 else min(n, self.size - self._pos)
        if n <= 0:
            return b""
        lo = self._pos - self._buf_start
        if not (lo >= 0 and lo + n <= len(self._buf)):
            self._fill(n)
            lo = 0
        data = self._buf[lo : lo + n]
        self._pos += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        self._buf = b""

    def __enter__(self) -> RangedObject:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ArchiveReader:
    """Members of one archive read by coalesced ranged GETs: blocks of ``COALESCE_BYTES``, ``IN_FLIGHT`` ahead.

    Members read in archive order (how the manifest lists them) are served from blocks fetched ahead; a member
    that does not follow the last read is read by its own ranged GET, so a shuffled partition does not fetch what
    it will not use, and a partition that starts mid-archive coalesces from its second member on.
    """

    def __init__(self, settings: S3Settings, bucket: str, key: str) -> None:
        self.getter, self.bucket, self.key = getter_for(settings), bucket, key
        found = head(client_for(settings), bucket, key)
        if found is None:
            raise S3SourceError(f"archive s3://{bucket}/{key} vanished since the scan")
        self.size = int(found["ContentLength"])
        self._blocks: dict[int, Future[bytes]] = {}
        self._last = -1
        self._lock = threading.Lock()

    def _block(self, index: int) -> Future[bytes]:
        if index not in self._blocks:
            start = index * COALESCE_BYTES
            end = min(self.size, start + COALESCE_BYTES)
            self._blocks[index] = _pool().submit(get_range, self.getter, self.bucket, self.key, start, end)
        return self._blocks[index]

    def read(self, offset: int, size: int, exact: bool = False) -> bytes:
        """SIZE bytes at OFFSET (fewer when the archive ends first). EXACT, or not where the last read ended: by one
        ranged GET of those bytes alone (a shuffled member; the start of a partition, which then reads forward)."""
        first, last = offset // COALESCE_BYTES, (offset + max(size, 1) - 1) // COALESCE_BYTES
        with self._lock:
            jump = exact or (first not in (self._last, self._last + 1) and first not in self._blocks)
            self._last = self._last if exact else last
        if jump:
            return get_range(self.getter, self.bucket, self.key, offset, min(self.size, offset + size))
        with self._lock:
            for stale in [i for i in self._blocks if i < first]:
                del self._blocks[stale]
            futures = [self._block(i) for i in range(first, max(last, first + IN_FLIGHT - 1) + 1)]
            self._last = last
        parts = [f.result() for f in futures[: last - first + 1]]
        lo = offset - first * COALESCE_BYTES
        return b"".join(parts)[lo : lo + size]


_archives: OrderedDict[tuple[str, str, str], ArchiveReader] = OrderedDict()
_archives_lock = threading.Lock()
_pools: dict[int, ThreadPoolExecutor] = {}


def _pool() -> ThreadPoolExecutor:
    """This process's pool for ranged GETs in flight (made after a fork, never inherited: its threads are not)."""
    pid = os.getpid()
    if pid not in _pools:
        _pools.clear()
        _archives.clear()
        _pools[pid] = ThreadPoolExecutor(max_workers=2 * IN_FLIGHT, thread_name_prefix="imgest-s3-source")
    return _pools[pid]


def _archive(settings: S3Settings, bucket: str, key: str) -> ArchiveReader:
    ident = (settings.endpoint_url or "", bucket, key)
    _pool()  # first in a forked process: drops readers inherited with the parent's requests in flight
    with _archives_lock:
        reader = _archives.get(ident)
        if reader is None:
            reader = _archives[ident] = ArchiveReader(settings, bucket, key)
            while len(_archives) > ARCHIVE_READERS:
                _archives.popitem(last=False)
        _archives.move_to_end(ident)
        return reader


def read_s3_candidate(root: str | PurePath, cand: Candidate, exact: bool = False) -> bytes:
    """The bytes of CAND from the S3 source at ROOT: one GET for an object, coalesced ranges for a tar member
    (EXACT: the member's own range, for a member that does not follow the one read before it).

    A vanished object, or one whose ETag differs from the scan's, raises BadImage (missing); an archive that
    ends inside the member raises BadImage (corrupt). Other failures (refused keys, endpoint down) raise
    S3SourceError and fail the task, which Spark retries.
    """
    from botocore.exceptions import BotoCoreError

    bucket, prefix = split_url(root)
    base = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
    settings = settings_for(root)
    key = base + (cand.container or cand.rel_path)
    try:
        if cand.container:
            data = _archive(settings, bucket, key).read(cand.offset, cand.size, exact)
            if len(data) != cand.size:
                raise BadImage(Reason.CORRUPT, f"archive s3://{bucket}/{key} ends {cand.size - len(data)} bytes early")
            return data
        return getter_for(settings).get(bucket, key, etag=cand.etag)
    except S3RequestError as exc:
        if exc.status == 404 or exc.code in ("NoSuchKey", "NotFound"):
            raise BadImage(Reason.MISSING, f"s3://{bucket}/{key} vanished since the scan") from None
        if exc.status == 412 or exc.code == "PreconditionFailed":
            raise BadImage(Reason.MISSING, f"s3://{bucket}/{key} changed since the scan (ETag differs)") from None
        raise S3SourceError(f"cannot read {exc}; check the source connection") from None
    except (BotoCoreError, OSError) as exc:
        raise S3SourceError(f"cannot read s3://{bucket}/{key}: {exc}; check the source endpoint") from None
