"""Fencing on S3 as the stores enforce it: manifest.json is switched by a PUT conditional on the ETag its publisher
read (If-Match; If-None-Match: * when there was none), so a second publisher that read the same manifest, or none,
switches nothing; and a zombie attempt (the same run, an older attempt still running after Airflow retried its task)
publishes nothing. Against SeaweedFS (the embedded store) and the strict AWS, with a role's temporary keys and the
lock records in the role's bucket."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from imgest.core import locks
from imgest.core.lock_stores import S3LockStore
from imgest.core.settings import S3Settings
from imgest.services.s3 import S3Server
from imgest.services.strict_aws import StrictAws
from imgest.sinks.shards.manifest_switch import ABSENT, ManifestConflictError, read_live, switch
from imgest.sinks.shards.pack_publish import publish
from imgest.sinks.shards.store import open_store
from tests.conftest import serve

pytestmark = pytest.mark.services


@pytest.fixture(scope="module")
def aws() -> Iterator[StrictAws]:
    yield from serve("aws")  # type: ignore[misc]


@pytest.fixture(params=["seaweedfs", "strict-aws"])
def where(request: pytest.FixtureRequest) -> tuple[S3Settings, str]:
    """(settings, bucket): SeaweedFS's keys and bucket, or a role's temporary keys limited to a bucket of its own."""
    if request.param == "seaweedfs":
        server: S3Server = request.getfixturevalue("s3_server")
        return server.settings(), server.bucket
    aws: StrictAws = request.getfixturevalue("aws")
    bucket = f"fence-{secrets.token_hex(3)}"
    aws.client("s3").create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": aws.region})
    return aws.assume(aws.role(f"fence-{bucket}", [bucket])), bucket


def test_the_switch_is_conditional_on_the_manifest_read(where: tuple[S3Settings, str]) -> None:
    settings, bucket = where
    shards = open_store(f"s3://{bucket}/switch-{secrets.token_hex(3)}", settings)
    assert read_live(shards) == (None, ABSENT)
    switch(shards, {"key": "a"}, ABSENT)
    live, etag = read_live(shards)
    assert live == {"key": "a"}
    with pytest.raises(ManifestConflictError, match=r"PreconditionFailed|412"):
        switch(shards, {"key": "b"}, ABSENT)  # If-None-Match: * over a manifest that is there
    switch(shards, {"key": "c"}, etag)
    with pytest.raises(ManifestConflictError):
        switch(shards, {"key": "d"}, etag)  # If-Match on an ETag that is gone
    assert shards.read_manifest() == {"key": "c"}


def test_a_zombie_attempt_publishes_nothing(where: tuple[S3Settings, str]) -> None:
    """Attempt 1 of the run's ingest task stalls; Airflow starts attempt 2, which claims the lock (in S3, beside the
    data) and publishes. Attempt 1 resumes and reaches its publish: LockLostError naming attempt 2, nothing
    switched; and a publisher that passed its fence before the claim still cannot switch over a manifest it did not
    read."""
    settings, bucket = where
    prefix = f"zombie-{secrets.token_hex(3)}"
    store = S3LockStore(f"s3://{bucket}/{prefix}/_state", settings)
    shards = open_store(f"s3://{bucket}/{prefix}/ds", settings)
    run = locks.airflow_holder("ingest_imagenet", "manual__z", lease_s=600)
    assert locks.try_acquire("zds", run, store) is None
    zombie, retry = locks.Attempt("ingest_shards", 1), locks.Attempt("ingest_shards", 2)
    with locks.keep_alive("zds", run, store, zombie):
        assert publish(shards, {"key": "k1", "dataset": "zds", "shards": []})
        stale_view = read_live(shards)  # what the zombie read before it stalled
        with locks.keep_alive("zds", run, store, retry):
            assert publish(shards, {"key": "k2", "dataset": "zds", "shards": []})
        with pytest.raises(locks.LockLostError, match="attempt 2 of task ingest_shards holds it now"):
            publish(shards, {"key": "k-zombie", "dataset": "zds", "shards": []})
    with pytest.raises(ManifestConflictError):
        switch(shards, {"key": "k-zombie", "dataset": "zds"}, stale_view[1])
    assert (shards.read_manifest() or {})["key"] == "k2"
    assert locks.release("zds", run, store)
