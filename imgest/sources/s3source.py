"""An S3 source's URL and connection: ``s3://bucket/prefix/`` or a tar's URL, the settings that read it (its own
connection, from ``IMGEST_SOURCE_*`` or registered by the caller), and ``SourceRoot``, the manifest root that
carries them to the Spark executors inside the pickled task."""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import PurePath
from typing import Any

from imgest.core.errors import ImgestError
from imgest.core.settings import S3Settings, env_endpoint

log = logging.getLogger(__name__)


SCHEME = "s3://"


ENV_PREFIX = "IMGEST_SOURCE_"


def is_s3(src: str | PurePath) -> bool:
    """True when SRC names an S3 source (``s3://...``; a ``Path`` made of one collapses to ``s3:/...``)."""
    return str(src).startswith("s3:/")


def s3_url(src: str | PurePath) -> str:
    """SRC as ``s3://bucket/key`` (undoes the ``s3:/`` that ``Path`` makes of ``s3://``)."""
    text = str(src)
    if not is_s3(text):
        raise S3SourceError(f"{text!r} is not an s3:// URL")
    return SCHEME + text[len("s3:/") :].lstrip("/")


def split_url(url: str | PurePath) -> tuple[str, str]:
    """(bucket, key or prefix) of an S3 URL; a URL without a bucket is a clear error."""
    bucket, _, key = s3_url(url)[len(SCHEME) :].partition("/")
    if not bucket:
        raise S3SourceError(f"{url!s} names no bucket; write s3://bucket/prefix/")
    return bucket, key


def source_settings_from_env() -> S3Settings:
    """The source's connection from IMGEST_SOURCE_* variables; each unset one falls back to the destination's."""
    base = S3Settings.from_env()
    env = os.environ.get
    key, secret = env(ENV_PREFIX + "AWS_ACCESS_KEY_ID"), env(ENV_PREFIX + "AWS_SECRET_ACCESS_KEY")
    own = bool(key and secret)
    token, expiry = env(ENV_PREFIX + "AWS_SESSION_TOKEN"), env(ENV_PREFIX + "S3_CREDENTIALS_EXPIRY")
    return replace(
        base,
        endpoint_url=env_endpoint(ENV_PREFIX) or base.endpoint_url,
        access_key=key if own else base.access_key,
        secret_key=secret if own else base.secret_key,
        session_token=(token or None) if own else base.session_token,
        expires_at=(float(expiry) if token and expiry else None) if own else base.expires_at,
        region=env(ENV_PREFIX + "AWS_REGION") or base.region,
    )


def source_env(settings: S3Settings) -> dict[str, str]:
    """SETTINGS as the IMGEST_SOURCE_* variables a Spark driver or the CLI reads (for spark-submit's env); keys
    only when the connection has them (else the chain of the host that reads decides)."""
    from imgest.core.credentials import env_of

    env = {**env_of(settings, ENV_PREFIX), ENV_PREFIX + "AWS_REGION": settings.region}
    if settings.endpoint_url:
        env[ENV_PREFIX + "S3_ENDPOINT"] = settings.endpoint_url
    return env


_REGISTERED: dict[str, S3Settings] = {}


def _root_key(root: str | PurePath) -> str:
    return s3_url(root).rstrip("/")


def register_source(root: str | PurePath, settings: S3Settings) -> None:
    """Use SETTINGS to read the source at ROOT in this process (done when a shipped SourceRoot is unpickled)."""
    _REGISTERED[_root_key(root)] = settings


def settings_for(root: str | PurePath) -> S3Settings:
    """The connection of the source at ROOT: the one shipped with the task or registered for ROOT or a prefix of it
    (the dataset's URL, whose layout root lies below it: ``.../ILSVRC/Data/CLS-LOC``), the longest such prefix
    first; else this process's environment."""
    key = _root_key(root)
    if key in _REGISTERED:
        return _REGISTERED[key]
    within = [r for r in _REGISTERED if key.startswith(r + "/")]
    return _REGISTERED[max(within, key=len)] if within else source_settings_from_env()


class SourceRoot(str):
    """A source root (an ``s3://`` URL) that carries its connection inside pickled Spark tasks.

    It compares and prints as the plain URL (the keys are never in its text); unpickling it on an executor
    registers the settings there, so ``read_candidate`` on that executor reads with the driver's connection.
    """

    settings: S3Settings

    def __new__(cls, url: str, settings: S3Settings) -> SourceRoot:
        obj = super().__new__(cls, url)
        obj.settings = settings
        return obj

    def __reduce__(self) -> tuple[Any, tuple[str, S3Settings]]:
        return _restore_root, (str(self), self.settings)


def _restore_root(url: str, settings: S3Settings) -> SourceRoot:
    register_source(url, settings)
    return SourceRoot(url, settings)


def shippable_root(root: str) -> str:
    """ROOT as a Spark driver ships it to executors: an S3 root carries this process's source connection."""
    if not is_s3(root):
        return root
    from imgest.core.bucket_region import for_bucket

    settings = settings_for(root).frozen()  # keys from this host's chain travel too (executors may have none)
    settings = for_bucket(settings, split_url(root)[0])  # executors sign for the bucket's region, asked once here
    register_source(root, settings)
    return SourceRoot(s3_url(root), settings)


class S3SourceError(ImgestError):
    """A source object could not be listed or read: the message names the object and what to check."""


def forget_sources() -> None:
    """Drop the connections registered in this process (see forget_connections)."""
    _REGISTERED.clear()
