"""Where shards go: a local folder or an S3 prefix, both with a staging area and a publish step.

Shards (and their .idx files) are first written under ``<dest>/_staging/``. Publishing moves them to
``<dest>/`` and then writes ``<dest>/manifest.json`` last: a reader that starts from the manifest never
sees a half-written dataset. Staged shards carry their sha256 and input digest, so an interrupted run
resumes by skipping what is already staged.

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
from pathlib import Path
from typing import Any, Protocol

from imgest.core import workdir
from imgest.core.errors import ConfigError
from imgest.core.settings import S3Settings

log = logging.getLogger(__name__)
STAGING = "_staging"
S3_MAX_METADATA_BYTES = 2048  # AWS: user-defined metadata of one object, names + values, UTF-8
S3_MAX_KEY_BYTES = 1024  # AWS: object key name, UTF-8


class ObjectLimitError(ConfigError):
    """An object name or its metadata would break an S3 limit."""


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
    """A destination for shards."""

    location: str

    def stage(self, local: Path, name: str, meta: dict[str, str]) -> None: ...

    def staged(self, name: str) -> dict[str, str] | None: ...

    def read_staged(self, name: str) -> bytes | None: ...

    def publish(self, names: list[str]) -> None: ...

    def read_manifest(self) -> dict[str, Any] | None: ...

    def write_manifest(self, manifest: dict[str, Any]) -> None: ...

    def withdraw_manifest(self) -> None: ...

    def read_chunks(self, name: str) -> Iterator[bytes] | None: ...

    def put_bytes(self, name: str, data: bytes) -> None: ...


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()


class LocalStore:
    """A folder; publishing is an atomic rename per file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.location = str(root)
        self._staging = root / STAGING

    def stage(self, local: Path, name: str, meta: dict[str, str]) -> None:
        check_metadata(str(self._staging / name), meta)  # the same contract as S3, so tests here catch it
        self._staging.mkdir(parents=True, exist_ok=True)
        partial = self._staging / (name + ".partial")
        try:
            os.replace(local, partial)  # the finished local file is ours to move
        except OSError:  # another filesystem
            shutil.copyfile(local, partial)
        os.replace(partial, self._staging / name)
        (self._staging / f"{name}.meta.json").write_text(json.dumps(meta, sort_keys=True))

    def staged(self, name: str) -> dict[str, str] | None:
        meta_path, data_path = self._staging / f"{name}.meta.json", self._staging / name
        if not (meta_path.is_file() and data_path.is_file()):
            return None
        meta = json.loads(meta_path.read_text())
        return meta if int(meta.get("bytes", -1)) == data_path.stat().st_size else None

    def read_staged(self, name: str) -> bytes | None:
        """The bytes of staged object NAME, or None when it is not staged."""
        path = self._staging / name
        return path.read_bytes() if path.is_file() else None

    def publish(self, names: list[str]) -> None:
        for name in names:
            if (self._staging / name).is_file():
                os.replace(self._staging / name, self.root / name)
            (self._staging / f"{name}.meta.json").unlink(missing_ok=True)
        if self._staging.is_dir() and not any(self._staging.iterdir()):
            self._staging.rmdir()

    def read_manifest(self) -> dict[str, Any] | None:
        path = self.root / workdir.PUBLISHED_MANIFEST
        return json.loads(path.read_text()) if path.is_file() else None

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        self.put_bytes(workdir.PUBLISHED_MANIFEST, manifest_bytes(manifest))

    def withdraw_manifest(self) -> None:
        (self.root / workdir.PUBLISHED_MANIFEST).unlink(missing_ok=True)

    def put_bytes(self, name: str, data: bytes) -> None:
        """Write a small published file atomically (temporary name, then rename)."""
        tmp = self.root / (name + ".partial")
        tmp.write_bytes(data)
        os.replace(tmp, self.root / name)

    def read_chunks(self, name: str) -> Iterator[bytes] | None:
        """A published file as a stream of 1 MiB chunks, or None if it is not there."""
        path = self.root / name
        if not path.is_file():
            return None

        def chunks() -> Iterator[bytes]:
            with open(path, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    yield chunk

        return chunks()


class S3Store:
    """An S3 prefix; uploads through boto3's transfer manager (multipart, concurrent, bounded memory)."""

    def __init__(self, settings: S3Settings, bucket: str, prefix: str) -> None:
        from boto3.s3.transfer import TransferConfig

        self.settings, self.bucket, self.prefix = settings, bucket, prefix.strip("/")
        self.location = f"s3://{bucket}/{self.prefix}"
        self._client = settings.client()
        self._transfer = TransferConfig(multipart_threshold=16 << 20, multipart_chunksize=16 << 20, max_concurrency=4)

    def _key(self, name: str, staging: bool = False) -> str:
        parts = [p for p in (self.prefix, STAGING if staging else "", name) if p]
        return check_key("/".join(parts))

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

    def stage(self, local: Path, name: str, meta: dict[str, str]) -> None:
        key = self._key(name, staging=True)
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

    def staged(self, name: str) -> dict[str, str] | None:
        from botocore.exceptions import ClientError

        try:
            head = self._client.head_object(Bucket=self.bucket, Key=self._key(name, staging=True))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        meta = head.get("Metadata", {})
        return meta if int(meta.get("bytes", -1)) == head["ContentLength"] else None

    def read_staged(self, name: str) -> bytes | None:
        """The bytes of staged object NAME (a small sidecar), or None when it is not staged."""
        from botocore.exceptions import ClientError

        try:
            return self._client.get_object(Bucket=self.bucket, Key=self._key(name, staging=True))["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

    def publish(self, names: list[str]) -> None:
        for name in names:
            src = {"Bucket": self.bucket, "Key": self._key(name, staging=True)}
            self._call(
                f"publishing {name}", self._client.copy, src, self.bucket, self._key(name), Config=self._transfer
            )
            self._call(f"cleaning {src['Key']}", self._client.delete_object, **src)

    def read_manifest(self) -> dict[str, Any] | None:
        from botocore.exceptions import ClientError

        try:
            body = self._client.get_object(Bucket=self.bucket, Key=self._key(workdir.PUBLISHED_MANIFEST))["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        return json.loads(body)

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        self._call(
            "writing manifest.json",
            self._client.put_object,
            Bucket=self.bucket,
            Key=self._key(workdir.PUBLISHED_MANIFEST),
            Body=manifest_bytes(manifest),
            ContentType="application/json",
        )

    def put_bytes(self, name: str, data: bytes) -> None:
        """Write a small published object."""
        self._call(f"writing {name}", self._client.put_object, Bucket=self.bucket, Key=self._key(name), Body=data)

    def read_chunks(self, name: str) -> Iterator[bytes] | None:
        """A published object as a stream of 1 MiB chunks, or None if it is not there."""
        from botocore.exceptions import ClientError

        try:
            body = self._client.get_object(Bucket=self.bucket, Key=self._key(name))["Body"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        return iter(lambda: body.read(1 << 20), b"")

    def withdraw_manifest(self) -> None:
        self._call(
            "withdrawing manifest.json",
            self._client.delete_object,
            Bucket=self.bucket,
            Key=self._key(workdir.PUBLISHED_MANIFEST),
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
