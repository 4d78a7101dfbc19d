"""Files a job's driver hands its executors: by path on shared storage, or staged in object storage.

The driver writes the manifest and the shard plan into its work folder. Executors on other machines do not see
that folder. With ``$IMGEST_STATE_URL`` (``s3://bucket/prefix``) set, the driver uploads each such file once to
``prefix/staging/<dataset>/<run>/<name>`` and executors open it there through Arrow's S3 filesystem: Parquet
reads only the footer and the row groups a task needs (ranged GETs), nothing is downloaded whole and nothing
on the executors' disks is assumed. Without it, executors open the same absolute path (one machine, or a
folder every node mounts at the same path). The staged objects are removed when the job ends.

The S3 settings travel inside the ``Staged`` object Spark pickles into its tasks (keys hidden from its repr),
as every other store setting does: never as Spark conf or environment.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imgest.core.bucket_region import for_bucket
from imgest.core.lock_stores import STATE_URL_ENV
from imgest.core.settings import S3Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Staged:
    """A file every executor can open: a local absolute path, or an ``s3://bucket/key`` object."""

    url: str
    s3: S3Settings | None = field(default=None, repr=False)

    @property
    def remote(self) -> bool:
        return self.url.startswith("s3://")

    def open(self) -> Any:
        """A seekable Arrow input file (S3: ranged reads) or the local path, for ``pq.ParquetFile``."""
        if not self.remote:
            return self.url
        return _filesystem(self.s3 or S3Settings.from_env()).open_input_file(self.url.removeprefix("s3://"))

    def parquet(self) -> Any:
        """The file as a ``pq.ParquetFile``; a local path missing here names the setting that avoids it."""
        import pyarrow.parquet as pq

        if not self.remote and not Path(self.url).exists():
            import socket

            raise FileNotFoundError(
                f"{self.url} is not on this machine ({socket.gethostname()}): executors that do not share the "
                f"driver's disk read the job's work files from object storage; set {STATE_URL_ENV}=s3://bucket/prefix "
                "where the job is submitted (docs/cluster.md)"
            )
        return pq.ParquetFile(self.open())


def _filesystem(s3: S3Settings) -> Any:
    """Arrow's S3 filesystem signing as S3 does: the settings' keys with their session token (temporary keys
    renewed from this host's chain as they near expiry, as every boto3 client of imgest), else the SDK's chain."""
    import pyarrow.fs as pafs

    endpoint = s3.endpoint_url or ""
    scheme, _, host = endpoint.partition("://") if "://" in endpoint else ("https", "", endpoint)
    credentials = s3.credentials() if s3.access_key and s3.secret_key else None
    frozen = credentials.get_frozen_credentials() if credentials is not None else None
    return pafs.S3FileSystem(
        access_key=frozen.access_key if frozen else None,
        secret_key=frozen.secret_key if frozen else None,
        session_token=(frozen.token or None) if frozen else None,
        region=s3.region,
        endpoint_override=host or None,
        scheme=scheme,
        connect_timeout=10,
        request_timeout=60,
    )


_stagers = itertools.count()


def _run_folder(dataset: str) -> str:
    """Where under ``staging/`` a Stager puts its files: a random folder of the dataset, or, in a deferrable Spark
    Connect job (``$IMGEST_CONNECT_RUN``, imgest.spark.detach), the same folder on each of its clients' runs inside
    the run's results folder: a client that left its operation running exits without closing its Stager (its
    executors still read the files), its next run stages the same names again, and the run's folder goes with the
    run (its last client, or the operator where none follows)."""
    run = os.environ.get("IMGEST_CONNECT_RUN", "")
    if run:
        return f"connect/{run}/staged-{next(_stagers)}"
    return f"{dataset or 'dataset'}/{secrets.token_hex(6)}"


class Stager:
    """Stages a job's work files for its executors; ``close`` removes what it staged."""

    def __init__(self, dataset: str, state_url: str | None, s3: S3Settings | None = None) -> None:
        self.state_url, self.s3 = state_url, s3
        self.staged: list[str] = []
        if state_url:
            bucket, _, prefix = state_url.removeprefix("s3://").partition("/")
            run = _run_folder(dataset)
            self.bucket, self.prefix = bucket, f"{prefix.strip('/')}/staging/{run}/".lstrip("/")
            # keys in them (a driver on a profile, SSO or a role resolves its chain once): executors have no chain
            self.s3 = for_bucket((s3 or S3Settings.from_env()).frozen(), bucket)  # Arrow signs for one region

    @classmethod
    def from_env(cls, dataset: str) -> Stager:
        from imgest.core.lock_stores import state_url

        return cls(dataset, state_url())

    def stage(self, path: Path) -> Staged:
        """PATH as executors will open it (uploaded once when a state URL is set)."""
        path = path.resolve()
        if not self.state_url:
            return Staged(str(path))
        assert self.s3 is not None
        key = f"{self.prefix}{path.name}"
        self.s3.client().upload_file(str(path), self.bucket, key)
        self.staged.append(key)
        log.info(
            "staged %s for the executors at s3://%s/%s (%d bytes)", path.name, self.bucket, key, path.stat().st_size
        )
        return Staged(f"s3://{self.bucket}/{key}", self.s3)

    def close(self) -> None:
        if self.staged and self.s3 is not None:
            client = self.s3.client()
            for key in self.staged:
                client.delete_object(Bucket=self.bucket, Key=key)
        self.staged.clear()

    def __enter__(self) -> Stager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
