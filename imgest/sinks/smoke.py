"""Round-trip checks that prove the storage services accept and return bytes unchanged."""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from typing import Any

from imgest.core.errors import ImgestError

log = logging.getLogger(__name__)

SMOKE_KEYSPACE = "imgest_smoke"


@dataclass(frozen=True)
class RoundTrip:
    """What a round-trip wrote and read back."""

    target: str
    nbytes: int
    sha256: str
    equal: bool


def cassandra_roundtrip(session: Any, nbytes: int = 1 << 20, keyspace: str = SMOKE_KEYSPACE) -> RoundTrip:
    """Write NBYTES of random data as one blob and read it back through a prepared statement."""
    session.execute(
        f"CREATE KEYSPACE IF NOT EXISTS {keyspace} "
        "WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}"
    )
    session.execute(f"CREATE TABLE IF NOT EXISTS {keyspace}.blobs (id text PRIMARY KEY, data blob)")
    blob = os.urandom(nbytes)
    digest = hashlib.sha256(blob).hexdigest()
    session.execute(session.prepare(f"INSERT INTO {keyspace}.blobs (id, data) VALUES (?, ?)"), (digest, blob))
    row = session.execute(session.prepare(f"SELECT data FROM {keyspace}.blobs WHERE id = ?"), (digest,)).one()
    if row is None:
        raise ImgestError(f"cassandra round-trip: row {digest} missing from {keyspace}.blobs after insert")
    result = RoundTrip(f"cassandra table {keyspace}.blobs", nbytes, digest, bytes(row.data) == blob)
    log.info("cassandra round-trip of %d bytes equal=%s", nbytes, result.equal)
    return result


def s3_roundtrip(client: Any, bucket: str, nbytes: int = 1 << 20, prefix: str = "imgest-smoke/") -> RoundTrip:
    """Put NBYTES of random data as one object (multipart above 8 MiB) and read it back."""
    import io

    from boto3.s3.transfer import TransferConfig

    blob = os.urandom(nbytes)
    digest = hashlib.sha256(blob).hexdigest()
    key = f"{prefix}{digest}"
    config = TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20)
    client.upload_fileobj(io.BytesIO(blob), bucket, key, Config=config)
    out = io.BytesIO()
    client.download_fileobj(bucket, key, out, Config=config)
    client.delete_object(Bucket=bucket, Key=key)
    result = RoundTrip(f"s3://{bucket}/{key}", nbytes, digest, out.getvalue() == blob)
    log.info("s3 round-trip of %d bytes equal=%s", nbytes, result.equal)
    return result
