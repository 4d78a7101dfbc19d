"""Where dataset locks live: a local folder (one machine) or an S3 prefix (any number of hosts).

Both stores offer the same four atomic steps on one small JSON record per dataset, each conditional on what
the caller last read, so two writers can never both believe they hold a lock:

- ``create``: write the record only if none exists (``O_EXCL``; S3 ``PUT`` with ``If-None-Match: *``);
- ``read``: the record, a version tag (file: mtime and inode; S3: the ETag) and its age in seconds, measured on
  the store's own clock (file: mtime against this host's clock; S3: ``Last-Modified`` against the response's
  ``Date``), so hosts with skewed clocks agree on whether a lease ran out;
- ``replace``: rewrite it only if it is still at the version read (S3 ``If-Match``): a renewal by its holder,
  or a takeover of an expired lease, which exactly one taker wins;
- ``delete``: remove it only if it is still at the version read.

Which stores (``lock_url_for``): a run that writes Cassandra keeps its lock in the keyspace it writes
(``cassandra://hosts/keyspace``: ``imgest.sinks.cassandra.lock_store``, found through the ``imgest.lock_stores``
entry point), where every writer of those tables finds it, whatever its state folder or bucket. A run that writes
elsewhere (shards, files) keeps it in ``$IMGEST_STATE_URL`` (``s3://bucket/prefix``: locks under ``prefix/locks/``),
else beside an ``s3://`` destination, else in the local state folder (``$IMGEST_HOME/locks``;
``IMGEST_STATE_URL=local`` says so explicitly, for hosts that all mount it). A run with both targets takes both locks
(``LockStores``), always in the order of their locations, so two writers never wait on each other's second lock.
The S3 store needs a server that honours conditional writes; AWS S3 and SeaweedFS do (checked by
``tests/integration/test_locks_hosts.py``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Protocol

from imgest.core.settings import CassandraSettings, S3Settings

STATE_URL_ENV = "IMGEST_STATE_URL"
LOCAL_STATE = "local"  # IMGEST_STATE_URL=local: the local state folder, which every host mounts
# Where this run's dataset lock lives when that is not its state URL: beside its S3 destination. Set by imgest itself
# (``lock_url_for``, for every task of a DAG run and every CLI writer), never by hand.
LOCK_URL_ENV = "IMGEST_LOCK_URL"
STATE_PREFIX = "_imgest-state"  # the prefix of the derived state URL in the destination's bucket
STORES_GROUP = "imgest.lock_stores"  # entry points: URL scheme -> a LockStore class (url, settings)
SEPARATOR = " | "  # between the locations of a LockStores (IMGEST_LOCK_URL, messages)


@dataclass(frozen=True)
class Record:
    """A lock record as read: its JSON fields, the version to make a conditional change against, its age (s)."""

    fields: dict[str, Any]
    version: str
    age_s: float


class LockStore(Protocol):
    location: str

    def create(self, name: str, fields: dict[str, Any]) -> bool: ...
    def read(self, name: str) -> Record | None: ...
    def replace(self, name: str, fields: dict[str, Any], version: str) -> bool: ...
    def delete(self, name: str, version: str) -> bool: ...
    def names(self) -> list[str]: ...


class FileLockStore:
    """Lock records as files of one folder (a single host, or a filesystem every host mounts with O_EXCL)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.location = str(folder)

    def _path(self, name: str) -> Path:
        return self.folder / f"{name}.json"

    def create(self, name: str, fields: dict[str, Any]) -> bool:
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self._path(name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as fh:
            json.dump(fields, fh)
        return True

    def read(self, name: str) -> Record | None:
        path = self._path(name)
        try:
            st, text = path.stat(), path.read_text()
        except FileNotFoundError:
            return None
        try:
            fields = json.loads(text)
        except ValueError:  # half-written by a holder that is creating it right now
            fields = {"kind": "unknown", "who": f"a writer creating {path}"}
        return Record(fields, f"{st.st_ino}:{st.st_mtime_ns}", max(0.0, time.time() - st.st_mtime))

    def replace(self, name: str, fields: dict[str, Any], version: str) -> bool:
        current = self.read(name)
        if current is None or current.version != version:
            return False
        # a temporary file of this thread's own: a holder's keep-alive thread renews while its job's thread fences
        tmp = self._path(name).with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(fields))
        os.replace(tmp, self._path(name))  # one host: the check above and this are not atomic across processes
        return True

    def delete(self, name: str, version: str) -> bool:
        current = self.read(name)
        if current is None or current.version != version:
            return False
        self._path(name).unlink(missing_ok=True)
        return True

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.folder.glob("*.json")) if self.folder.is_dir() else []


class S3LockStore:
    """Lock records as objects under an S3 prefix, changed only by conditional requests."""

    def __init__(self, url: str, settings: S3Settings) -> None:
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        self.bucket, self.prefix = bucket, f"{prefix.strip('/')}/locks/".lstrip("/")
        self.location = f"s3://{bucket}/{self.prefix}"
        self.client, self.settings = settings.client(), settings

    def _refused(self, exc: Exception) -> Exception:
        """EXC (a refused or failed request) as an error naming this lock store, the endpoint and the key id."""
        from imgest.core.errors import ImgestError

        code = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
        key = self.settings.access_key or "from the chain"
        where = f"S3 at {self.settings.endpoint_url or 'AWS'} (access key id {key!r})"
        return ImgestError(
            f"the dataset lock store {self.location}: {where} answered {code}; the identity needs s3:GetObject, "
            "s3:PutObject and s3:DeleteObject there ($IMGEST_STATE_URL, else beside the S3 destination)"
        )

    def _key(self, name: str) -> str:
        return f"{self.prefix}{name}.json"

    def _conditional(self, call: Any, **kw: Any) -> bool:
        from botocore.exceptions import ClientError

        try:
            call(Bucket=self.bucket, **kw)
        except ClientError as e:
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = e.response.get("Error", {}).get("Code")
            if status in (409, 412) or code in ("PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey"):
                return False
            raise self._refused(e) from None
        return True

    def create(self, name: str, fields: dict[str, Any]) -> bool:
        body = json.dumps(fields).encode()
        return self._conditional(self.client.put_object, Key=self._key(name), Body=body, IfNoneMatch="*")

    def read(self, name: str) -> Record | None:
        from botocore.exceptions import ClientError

        try:
            r = self.client.get_object(Bucket=self.bucket, Key=self._key(name))
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise self._refused(e) from None
        fields = json.loads(r["Body"].read())
        date = r["ResponseMetadata"].get("HTTPHeaders", {}).get("date")
        now = parsedate_to_datetime(date).timestamp() if date else time.time()
        return Record(fields, r["ETag"], max(0.0, now - r["LastModified"].timestamp()))

    def replace(self, name: str, fields: dict[str, Any], version: str) -> bool:
        body = json.dumps(fields).encode()
        return self._conditional(self.client.put_object, Key=self._key(name), Body=body, IfMatch=version)

    def delete(self, name: str, version: str) -> bool:
        return self._conditional(self.client.delete_object, Key=self._key(name), IfMatch=version)

    def names(self) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
        keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
        return sorted(k[len(self.prefix) : -len(".json")] for k in keys if k.endswith(".json"))


def state_setting() -> str:
    """``$IMGEST_STATE_URL`` as set: an ``s3://bucket/prefix``, ``local`` or '' (unset); ConfigError otherwise."""
    url = os.environ.get(STATE_URL_ENV, "").strip()
    if url and url != LOCAL_STATE and not url.startswith("s3://"):
        from imgest.core.errors import ConfigError

        raise ConfigError(
            f"{STATE_URL_ENV}={url!r}: expected s3://bucket/prefix, or {LOCAL_STATE} (or unset) for the local state "
            "folder"
        )
    return url


def state_url() -> str | None:
    """``$IMGEST_STATE_URL`` (an ``s3://bucket/prefix`` every host reaches), or None for the local state folder."""
    url = state_setting()
    return None if url == LOCAL_STATE else url or None


def derived_state_url(s3_dest: str) -> str:
    """The state URL kept beside S3_DEST: ``s3://<its bucket>/_imgest-state``."""
    bucket = s3_dest.removeprefix("s3://").partition("/")[0]
    return f"s3://{bucket}/{STATE_PREFIX}"


def lock_url_for(s3_dest: str | None, cassandra_url: str | None = None) -> str | None:
    """Where the lock of a run writing S3_DEST (an ``s3://`` shards destination, or None) and, with CASSANDRA_URL
    (``cassandra_lock_url``), Cassandra tables lives, the same for the CLI and every DAG on any deployment: the
    keyspace's store for the tables; for the rest ``$IMGEST_STATE_URL`` when set, else beside an ``s3://`` S3_DEST
    (its bucket's ``_imgest-state``), else this machine's state folder. Several locations are joined by SEPARATOR
    in the order they are taken; None: the local state folder alone."""
    setting = state_setting()
    other = None if setting == LOCAL_STATE else setting or None
    if not setting and s3_dest and s3_dest.startswith("s3://"):
        other = derived_state_url(s3_dest)
    if not cassandra_url:
        return other
    if s3_dest and other is None:  # the tables and a destination on this machine's disk
        from imgest.core.paths import state_dir

        other = str(state_dir() / "locks")
    urls = sorted([cassandra_url, *([other] if s3_dest and other else [])])
    return SEPARATOR.join(urls)


def cassandra_lock_url(settings: CassandraSettings, keyspace: str, replication: str | None = None) -> str:
    """The lock store in KEYSPACE of the cluster of SETTINGS: ``cassandra://hosts:port/keyspace`` (REPLICATION: the
    keyspace's, should the lock be the first to create it)."""
    from urllib.parse import quote

    query = f"?replication={quote(replication, safe='')}" if replication else ""
    return f"cassandra://{','.join(settings.hosts)}:{settings.port}/{keyspace}{query}"


_PROCESS: dict[str, CassandraSettings] = {}


def use_cassandra(settings: CassandraSettings) -> None:
    """The Cassandra settings this process reaches a keyspace's lock store with where no caller names them (the
    CLI: its flags; a Spark driver: its job's), rather than the environment's alone."""
    _PROCESS["cassandra"] = settings


def process_cassandra() -> CassandraSettings | None:
    return _PROCESS.get("cassandra")


def lock_url() -> str | None:
    """The lock store's URL for this process: ``$IMGEST_LOCK_URL`` (set by imgest for the run), else the state URL."""
    return os.environ.get(LOCK_URL_ENV) or state_url()


class LockStores:
    """The stores one lock is taken in, in the order it is taken (``imgest.core.locks`` takes, renews, fences and
    gives back the lock in each); LOCATION names them all."""

    def __init__(self, stores: Sequence[LockStore]) -> None:
        self.stores = tuple(stores)
        self.location = SEPARATOR.join(s.location for s in self.stores)

    def __iter__(self) -> Iterator[LockStore]:
        return iter(self.stores)


def default_store(settings: S3Settings | None = None) -> LockStore:
    """The first store of ``default_stores`` (a process that holds one lock store: the CLI's ``imgest locks``)."""
    return default_stores(settings).stores[0]


def default_stores(settings: S3Settings | None = None, cassandra: CassandraSettings | None = None) -> LockStores:
    """The stores named by ``$IMGEST_LOCK_URL`` or ``$IMGEST_STATE_URL`` (S3 reached with SETTINGS or the
    environment's, Cassandra with CASSANDRA or the environment's), else the local state folder's."""
    from imgest.core.paths import state_dir

    url = lock_url()
    if url is None:
        return LockStores([FileLockStore(state_dir() / "locks")])
    return stores_at(url, settings, cassandra)


def stores_at(
    location: str, settings: S3Settings | None = None, cassandra: CassandraSettings | None = None
) -> LockStores:
    """The stores of LOCATION (one location, or several joined by SEPARATOR)."""
    parts = [p.strip() for p in location.split(SEPARATOR.strip()) if p.strip()]
    return LockStores([store_at(p, settings, cassandra) for p in parts])


def store_at(
    location: str, settings: S3Settings | None = None, cassandra: CassandraSettings | None = None
) -> LockStore:
    """The store whose ``location`` (or URL) is LOCATION (how a holder names its store to the processes it starts):
    an S3 one reached with SETTINGS or the environment's; another scheme's through its ``imgest.lock_stores`` entry
    point (``cassandra``: with CASSANDRA or the environment's settings); else a folder."""
    if location.startswith("s3://"):
        return S3LockStore(location.rstrip("/").removesuffix("locks").rstrip("/"), settings or S3Settings.from_env())
    scheme, sep, _ = location.partition("://")
    if not sep:
        return FileLockStore(Path(location))
    from importlib.metadata import entry_points

    found = list(entry_points(group=STORES_GROUP, name=scheme))
    if not found:
        from imgest.core.errors import ConfigError

        raise ConfigError(f"no lock store serves {scheme}:// ({location}); is imgest installed (pip install imgest)?")
    return found[0].load()(location, cassandra if scheme == "cassandra" else None)
