"""The embedded SeaweedFS S3 server: multipart transfers and enforced keys."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import pytest
from boto3.s3.transfer import TransferConfig

from imgest.core.settings import S3Settings
from imgest.services.s3 import S3Server
from imgest.sinks.shards.s3_client import S3AccessError, check_access

pytestmark = pytest.mark.services


def test_64mb_multipart_put_get(s3_server: S3Server) -> None:
    client = s3_server.settings().client()
    blob = os.urandom(64 * 1024 * 1024)
    key = "tests/multipart-64mb.bin"
    config = TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20, max_concurrency=4)
    client.upload_fileobj(io.BytesIO(blob), s3_server.bucket, key, Config=config)
    head = client.head_object(Bucket=s3_server.bucket, Key=key)
    assert head["ContentLength"] == len(blob)
    assert head["ETag"].strip('"').endswith("-8")  # assembled from 8 parts of 8 MiB
    out = io.BytesIO()
    client.download_fileobj(s3_server.bucket, key, out, Config=config)
    assert hashlib.sha256(out.getvalue()).digest() == hashlib.sha256(blob).digest()
    client.delete_object(Bucket=s3_server.bucket, Key=key)


def test_right_keys_pass_access_check(s3_server: S3Server) -> None:
    check_access(s3_server.settings(), s3_server.bucket)


def test_wrong_secret_is_refused_with_clear_error(s3_server: S3Server) -> None:
    good = s3_server.settings()
    bad = S3Settings(
        endpoint_url=good.endpoint_url,
        access_key=good.access_key,
        secret_key="wrong-secret",
        bucket=good.bucket,
    )
    with pytest.raises(S3AccessError) as err:
        check_access(bad, s3_server.bucket)
    message = str(err.value)
    assert "refused the credentials" in message
    assert good.endpoint_url in message
    assert repr(good.bucket) in message
    assert repr(good.access_key) in message
    assert "wrong-secret" not in message


def test_unknown_key_id_is_refused(s3_server: S3Server) -> None:
    good = s3_server.settings()
    bad = S3Settings(endpoint_url=good.endpoint_url, access_key="nobody", secret_key="x", bucket=good.bucket)
    with pytest.raises(S3AccessError, match="refused the credentials"):
        check_access(bad, s3_server.bucket)


def _listening_addresses(pid: int) -> set[str]:
    """Local IPv4/IPv6 addresses (hex, as in /proc/net) of the sockets PID listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    addresses = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A = LISTEN
                addresses.add(fields[1].split(":")[0])
    return addresses


def test_server_listens_on_loopback_only(s3_server: S3Server) -> None:
    pid = s3_server.process.pid()
    if pid is None:
        pytest.skip("the S3 server was started outside imgest; its sockets are not ours to inspect")
    addresses = _listening_addresses(pid)
    assert addresses, "weed listens on no TCP socket"
    assert addresses == {"0100007F"}  # 127.0.0.1 in /proc/net/tcp byte order


def test_shipped_keys_renewed_from_the_hosts_own_chain(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """An executor holding shipped temporary keys that are about to expire (here: keys the server no longer
    knows) signs with its own chain's keys: both the boto3 client and the source's object getter read on."""
    from dataclasses import replace

    from imgest.sources.s3objects import ObjectGetter

    good = s3_server.settings()
    client = good.client()
    client.put_object(Bucket=good.bucket, Key="tests/renewed.txt", Body=b"renewed")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", good.access_key or "")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", good.secret_key or "")
    import time

    shipped = replace(
        good, access_key="ASIAEXPIRED", secret_key="revoked", session_token="t", expires_at=time.time() + 5
    )
    body = shipped.client().get_object(Bucket=good.bucket, Key="tests/renewed.txt")["Body"].read()
    assert body == b"renewed"
    assert ObjectGetter(shipped).get(good.bucket, "tests/renewed.txt") == b"renewed"
    stale = replace(shipped, expires_at=time.time() + 7200)  # far from expiry: the shipped keys sign, and are refused
    with pytest.raises(S3AccessError, match="refused"):
        check_access(stale, s3_server.bucket)
