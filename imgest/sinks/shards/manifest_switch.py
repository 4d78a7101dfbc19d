"""The switch of ``manifest.json``, conditional on the manifest the publisher read: the store's own fence.

The dataset lock's fence (``imgest.core.locks.check_fence``) proves the holding right before the switch; this makes
the switch itself refuse to land over a manifest the publisher never saw: on S3 a ``PUT`` with ``If-Match`` on the
ETag it read (``If-None-Match: *`` when there was none), so a second writer that slipped past every lock (another
lock store, a zombie between its fence and its PUT, a hand-run script) cannot overwrite what it did not read; in a
folder the same comparison under an exclusive ``flock`` of the folder itself. Either way a lost race raises
``ManifestConflictError`` and nothing is switched.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from typing import Any

from imgest.core import workdir
from imgest.core.errors import LockLostError
from imgest.sinks.shards.store import LocalStore, ShardStore, manifest_bytes

ABSENT = "absent"  # the version of a manifest that is not there


class ManifestConflictError(LockLostError):
    """manifest.json changed between the publisher's read and its switch: another writer published."""


def _conflict(location: str, detail: str) -> ManifestConflictError:
    return ManifestConflictError(
        f"manifest.json of {location} changed since this run read it ({detail}): another writer published meanwhile; "
        "this run switched nothing. Run it again once that writer is done (its shards stay until gc)"
    )


def read_live(store: ShardStore) -> tuple[dict[str, Any] | None, str]:
    """The live manifest of STORE and its version (S3: its ETag; a folder: the sha256 of its bytes; ABSENT)."""
    if isinstance(store, LocalStore):
        path = store.root / workdir.PUBLISHED_MANIFEST
        body = path.read_bytes() if path.is_file() else None
        return (None, ABSENT) if body is None else (json.loads(body), hashlib.sha256(body).hexdigest())
    from botocore.exceptions import ClientError

    key = store._key(workdir.PUBLISHED_MANIFEST)  # type: ignore[attr-defined]
    try:
        got = store._client.get_object(Bucket=store.bucket, Key=key)  # type: ignore[attr-defined]
    except ClientError as exc:
        if str(exc.response.get("Error", {}).get("Code")) in ("NoSuchKey", "404", "NotFound"):
            return None, ABSENT
        raise
    return json.loads(got["Body"].read()), str(got["ETag"])


def switch(store: ShardStore, manifest: dict[str, Any], version: str) -> None:
    """Write MANIFEST as STORE's manifest.json only if the live one is still at VERSION (``read_live``)."""
    if isinstance(store, LocalStore):
        store.root.mkdir(parents=True, exist_ok=True)
        guard = os.open(store.root, os.O_RDONLY)  # the folder itself is the lock: no file of its own in the store
        try:
            fcntl.flock(guard, fcntl.LOCK_EX)
            now = read_live(store)[1]
            if now != version:
                raise _conflict(store.location, f"its sha256 is {now[:12]}, this run read {version[:12]}")
            store.put_bytes(workdir.PUBLISHED_MANIFEST, manifest_bytes(manifest))
        finally:
            os.close(guard)
        return
    from botocore.exceptions import ClientError

    condition = {"IfNoneMatch": "*"} if version == ABSENT else {"IfMatch": version}
    try:
        store._client.put_object(  # type: ignore[attr-defined]
            Bucket=store.bucket,  # type: ignore[attr-defined]
            Key=store._key(workdir.PUBLISHED_MANIFEST),  # type: ignore[attr-defined]
            Body=manifest_bytes(manifest),
            ContentType="application/json",
            **condition,
        )
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code"))
        if code in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
            raise _conflict(store.location, f"{code} on {next(iter(condition))} {version}") from None
        from imgest.sinks.shards.s3_client import describe_client_error

        err = describe_client_error(store.settings, store.bucket, exc)  # type: ignore[attr-defined]
        raise type(err)(f"writing manifest.json: {err}") from None
