"""Where shards go: a local folder or an S3 prefix, written once under a versioned prefix, published by one write.

Each run of the pack job writes its shards (and their .idx and .info.json sidecars) straight to their final,
immutable names under ``<dest>/v/<key>/``, where ``<key>`` is the digest of the run's shard plan and transform
(``plan.version_key``): a re-run writes the same names, and an interrupted run resumes by skipping objects that
are already there with a matching input digest. Publishing is one write of ``<dest>/manifest.json`` (a rename in
a folder, one PUT on S3) whose entries name each object by its path relative to ``<dest>``; nothing is copied or
deleted, and the previous manifest's objects stay readable. Every published manifest is also kept as
``<dest>/manifests/<key>.json`` and names the key it replaced (``previous``), so ``imgest gc shards`` can tell
which superseded objects it may collect. Manifests written before this layout name their shards at the top of
``<dest>`` (no ``path``); ``shard_object`` reads both.

S3 limits (AWS's documented ones) are checked before a request leaves: user metadata of one object at most
2 KB (names and values, UTF-8), object keys at most 1,024 bytes. Object metadata therefore only holds small
fixed-size fields; anything that grows with the data (label counts, quarantine lists) goes into a sidecar
object (``workdir.shard_info``) and the manifest.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from imgest.core import workdir
from imgest.core.errors import ConfigError, ImgestError
from imgest.core.settings import S3Settings

log = logging.getLogger(__name__)
LOCAL_META = ".meta.json"  # a folder keeps an object's metadata in this file beside it (S3: object metadata)
S3_MAX_METADATA_BYTES = 2048  # AWS: user-defined metadata of one object, names + values, UTF-8
S3_MAX_KEY_BYTES = 1024  # AWS: object key name, UTF-8
S3_DELETE_BATCH = 1000  # AWS: keys per DeleteObjects request


class ObjectLimitError(ConfigError):
    """An object name or its metadata would break an S3 limit."""


class StoreWriteError(ImgestError):
    """A store refused to delete or write some objects."""


@dataclass(frozen=True)
class StoredObject:
    """One object under a store's destination: NAME relative to it, its size and last-modified time (epoch s)."""

    name: str
    size: int
    modified: float


def check_metadata(key: str, meta: dict[str, str]) -> None:
    """Refuse META for object KEY when it would not fit in S3's 2 KB of user metadata."""
    size = sum(len(k.encode()) + len(str(v).encode()) for k, v in meta.items())
    if size > S3_MAX_METADATA_BYTES:
        raise ObjectLimitError(
            f"metadata of {key} is {size} bytes, over S3's {S3_MAX_METADATA_BYTES}-byte limit "
            f"(fields {', '.join(sorted(meta))}); put large values in a sidecar object"
        )


def check_key(key: str) -> str:
    """KEY, if it fits S3's 1,024-byte limit on key names."""
    if len(key.encode()) > S3_MAX_KEY_BYTES:
        raise ObjectLimitError(
            f"object key {key[:80]}... is {len(key.encode())} bytes, over S3's 1024; use a shorter prefix"
        )
    return key


class ShardStore(Protocol):
    """A destination for shards. Every NAME is relative to the destination (``v/<key>/train-000000.tar``)."""

    location: str

    def put_file(self, local: Path, name: str, meta: dict[str, str]) -> None: ...

    def written(self, name: str) -> dict[str, str] | None: ...

    def size(self, name: str) -> int | None: ...

    def read_bytes(self, name: str) -> bytes | None: ...

    def read_chunks(self, name: str) -> Iterator[bytes] | None: ...

    def put_bytes(self, name: str, data: bytes) -> None: ...

    def read_manifest(self) -> dict[str, Any] | None: ...

    def write_manifest(self, manifest: dict[str, Any]) -> None: ...

    def list_objects(self, under: str) -> Iterator[StoredObject]: ...

    def delete(self, names: list[str]) -> None: ...


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()


class LocalStore:
    """A folder; every file appears by an atomic rename, its metadata in ``<name>.meta.json`` beside it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.location = str(root)

    def put_file(self, local: Path, name: str, meta: dict[str, str]) -> None:
        """Move the finished file LOCAL to NAME (atomically), then record META beside it."""
        path = self.root / name
        check_metadata(str(path), meta)  # the same contract as S3, so tests here catch it
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        try:
            os.replace(local, partial)  # the finished local file is ours to move
        except OSError:  # another filesystem
            shutil.copyfile(local, partial)
        os.replace(partial, path)
        self.put_bytes(name + LOCAL_META, json.dumps(meta, sort_keys=True).encode())

    def written(self, name: str) -> dict[str, str] | None:
        """The metadata of NAME when it is completely written (its size is the recorded one), else None."""
        meta_path, data_path = self.root / (name + LOCAL_META), self.root / name
        if not (meta_path.is_file() and data_path.is_file()):
            return None
        meta = json.loads(meta_path.read_text())
        return meta if int(meta.get("bytes", -1)) == data_path.stat().st_size else None

    def size(self, name: str) -> int | None:
        """The size of NAME in bytes, or None when it is not there."""
        path = self.root / name
        return path.stat().st_size if path.is_file() else None

    def read_bytes(self, name: str) -> bytes | None:
        """The bytes of NAME (a small file), or None when it is not there."""
        path = self.root / name
        return path.read_bytes() if path.is_file() else None

    def read_manifest(self) -> dict[str, Any] | None:
        path = self.root / workdir.PUBLISHED_MANIFEST
        return json.loads(path.read_text()) if path.is_file() else None

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        """Publish MANIFEST: one atomic rename of ``manifest.json``."""
        self.put_bytes(workdir.PUBLISHED_MANIFEST, manifest_bytes(manifest))

    def put_bytes(self, name: str, data: bytes) -> None:
        """Write a small file atomically (temporary name, then rename)."""
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".partial")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def read_chunks(self, name: str) -> Iterator[bytes] | None:
        """A file as a stream of 1 MiB chunks, or None if it is not there."""
        path = self.root / name
        if not path.is_file():
            return None

        def chunks() -> Iterator[bytes]:
            with open(path, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    yield chunk

        return chunks()

    def list_objects(self, under: str) -> Iterator[StoredObject]:
        """Every file below the folder UNDER (relative names, '/' separated), in no particular order."""
        top = self.root / under
        for folder, _, files in os.walk(top):
            for file in files:
                path = Path(folder) / file
                try:
                    st = path.stat()
                except FileNotFoundError:  # removed while we walked
                    continue
                yield StoredObject(path.relative_to(self.root).as_posix(), st.st_size, st.st_mtime)

    def delete(self, names: list[str]) -> None:
        """Remove the files NAMES (missing ones are fine), then the folders they leave empty."""
        folders = set()
        for name in names:
            (self.root / name).unlink(missing_ok=True)
            folders.add((self.root / name).parent)
        for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
            while folder != self.root and folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
                folder = folder.parent


def _missing(exc: Exception) -> bool:
    """True when the botocore ClientError EXC says the object is not there."""
    code = getattr(exc, "response", {}).get("Error", {}).get("Code")
    return code in ("404", "NoSuchKey", "NotFound")


class S3Store:
    """An S3 prefix; uploads through boto3's transfer manager (multipart, concurrent, bounded memory)."""

    def __init__(self, settings: S3Settings, bucket: str, prefix: str) -> None:
        from boto3.s3.transfer import TransferConfig

        self.settings, self.bucket, self.prefix = settings, bucket, prefix.strip("/")
        self.location = f"s3://{bucket}/{self.prefix}"
        self._client = settings.client()
        self._transfer = TransferConfig(multipart_threshold=16 << 20, multipart_chunksize=16 << 20, max_concurrency=4)

    def _key(self, name: str) -> str:
        return check_key("/".join(p for p in (self.prefix, name) if p))

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        from imgest.sinks.shards.s3_client import describe_client_error

        try:
            return fn(*args, **kwargs)
        except (ClientError, BotoCoreError) as exc:
            err = describe_client_error(self.settings, self.bucket, exc)
            raise type(err)(f"{what}: {err}") from None

    def check(self) -> None:
        """Fail fast, with endpoint, bucket and key id, if the credentials or bucket are wrong."""
        self._call(f"checking {self.location}", self._client.head_bucket, Bucket=self.bucket)

    def put_file(self, local: Path, name: str, meta: dict[str, str]) -> None:
        """Upload the finished file LOCAL as NAME with user metadata META (the object appears when complete)."""
        key = self._key(name)
        check_metadata(key, meta)
        self._call(
            f"uploading {key}",
            self._client.upload_file,
            str(local),
            self.bucket,
            key,
            ExtraArgs={"Metadata": meta},
            Config=self._transfer,
        )

    def _head(self, name: str) -> dict[str, Any] | None:
        from botocore.exceptions import ClientError

        try:
            return self._client.head_object(Bucket=self.bucket, Key=self._key(name))
        except ClientError as exc:
            if _missing(exc):
                return None
            raise

    def written(self, name: str) -> dict[str, str] | None:
        """The metadata of NAME when it is completely written (its size is the recorded one), else None."""
        head = self._head(name)
        if head is None:
            return None
        meta = head.get("Metadata", {})
        return meta if int(meta.get("bytes", -1)) == head["ContentLength"] else None

    def size(self, name: str) -> int | None:
        """The size of NAME in bytes, or None when it is not there."""
        head = self._head(name)
        return None if head is None else int(head["ContentLength"])

    def read_bytes(self, name: str) -> bytes | None:
        """The bytes of NAME (a small object), or None when it is not there."""
        from botocore.exceptions import ClientError

        try:
            return self._client.get_object(Bucket=self.bucket, Key=self._key(name))["Body"].read()
        except ClientError as exc:
            if _missing(exc):
                return None
            raise

    def read_manifest(self) -> dict[str, Any] | None:
        body = self.read_bytes(workdir.PUBLISHED_MANIFEST)
        return None if body is None else json.loads(body)

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        """Publish MANIFEST: one PUT of ``manifest.json``."""
        self._call(
            "writing manifest.json",
            self._client.put_object,
            Bucket=self.bucket,
            Key=self._key(workdir.PUBLISHED_MANIFEST),
            Body=manifest_bytes(manifest),
            ContentType="application/json",
        )

    def put_bytes(self, name: str, data: bytes) -> None:
        """Write a small object."""
        self._call(f"writing {name}", self._client.put_object, Bucket=self.bucket, Key=self._key(name), Body=data)

    def read_chunks(self, name: str) -> Iterator[bytes] | None:
        """An object as a stream of 1 MiB chunks, or None if it is not there."""
        from botocore.exceptions import ClientError

        try:
            body = self._client.get_object(Bucket=self.bucket, Key=self._key(name))["Body"]
        except ClientError as exc:
            if _missing(exc):
                return None
            raise
        return iter(lambda: body.read(1 << 20), b"")

    def list_objects(self, under: str) -> Iterator[StoredObject]:
        """Every object below UNDER/ (relative names), a page of up to 1,000 keys at a time."""
        start = len(self.prefix) + 1 if self.prefix else 0
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self._key(under) + "/"
        )
        from botocore.exceptions import BotoCoreError, ClientError

        from imgest.sinks.shards.s3_client import describe_client_error

        try:
            for page in pages:
                for obj in page.get("Contents", []):
                    yield StoredObject(obj["Key"][start:], int(obj["Size"]), obj["LastModified"].timestamp())
        except (ClientError, BotoCoreError) as exc:
            err = describe_client_error(self.settings, self.bucket, exc)
            raise type(err)(f"listing {self.location}/{under}/: {err}") from None

    def delete(self, names: list[str]) -> None:
        """Delete NAMES with DeleteObjects, 1,000 keys a request; StoreWriteError names the keys it refused."""
        for at in range(0, len(names), S3_DELETE_BATCH):
            batch = [{"Key": self._key(n)} for n in names[at : at + S3_DELETE_BATCH]]
            reply = self._call(
                f"deleting {len(batch)} objects under {self.location}",
                self._client.delete_objects,
                Bucket=self.bucket,
                Delete={"Objects": batch, "Quiet": True},
            )
            errors = reply.get("Errors", [])
            if errors:
                shown = ", ".join(f"{e.get('Key')} ({e.get('Code')})" for e in errors[:5])
                raise StoreWriteError(
                    f"S3 at {self.settings.endpoint_url or 'AWS'} refused to delete {len(errors)} objects of "
                    f"s3://{self.bucket}: {shown}; check the key's delete permission and run gc again"
                )


S3_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def dest_problem(dest: str) -> str | None:
    """Why DEST cannot hold shards (None when it can): s3://bucket/prefix with a plain prefix, or a folder."""
    if not dest.startswith("s3://"):
        return f"destination {dest!r}: only s3:// URLs and local folders are supported" if "://" in dest else None
    bucket, _, prefix = dest[5:].partition("/")
    if not S3_BUCKET_NAME.match(bucket):
        return (
            f"destination {dest!r}: {bucket!r} is not an S3 bucket name (3-63 of a-z 0-9 . -); use s3://bucket/prefix"
        )
    segments = prefix.rstrip("/").split("/") if prefix.rstrip("/") else []
    if any(seg in ("", ".", "..") for seg in segments):
        return f"destination {dest!r}: the prefix may not hold empty, '.' or '..' segments"
    if any(ch in prefix for ch in "\\\n\r\t "):
        return f"destination {dest!r}: the prefix may not hold backslashes or white space"
    return None


def open_store(dest: str, settings: S3Settings | None = None) -> ShardStore:
    """LocalStore for a path, S3Store for s3://bucket/prefix (settings from the environment by default)."""
    problem = dest_problem(dest)
    if problem:
        raise ConfigError(problem)
    if dest.startswith("s3://"):
        bucket, _, prefix = dest[5:].partition("/")
        return S3Store(settings or S3Settings.from_env(), bucket, prefix.rstrip("/"))
    return LocalStore(Path(dest))
