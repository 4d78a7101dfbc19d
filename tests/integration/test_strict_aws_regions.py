"""Buckets in regions other than the connection's, against a server that refuses a request signed for another
region than its bucket's, as AWS does (400 AuthorizationHeaderMalformed naming the bucket's region): boto3 follows
that answer by itself; Arrow's S3 filesystem, DALI's SDK and imgest's own signed GETs do not, so imgest asks the
bucket its region and signs for it. A pod's run (IRSA: a web identity token file and AWS_ROLE_ARN, the connection in
eu-west-1) from a source in us-west-2 to shards and run state in ap-southeast-2 stores, verifies and publishes."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from imgest.core.settings import S3Settings
from imgest.services.strict_aws import StrictAws
from imgest.sources.devdata.sample import SampleSpec, write_sample
from tests.conftest import serve

pytestmark = pytest.mark.services
TOKEN = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6aW5nZXN0In0."


@pytest.fixture(scope="module")
def aws() -> Iterator[StrictAws]:
    yield from serve("aws")  # type: ignore[misc]


def _bucket(aws: StrictAws, prefix: str, region: str) -> str:
    """A new bucket in REGION (CreateBucket signed for that region, as S3 wants its LocationConstraint)."""
    from dataclasses import replace

    name = f"{prefix}-{secrets.token_hex(3)}"
    client = replace(aws.admin(), region=region).client()
    client.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": region})
    return name


def pod_env(monkeypatch: pytest.MonkeyPatch, aws: StrictAws, role_arn: str, folder: Path) -> None:
    """This process as an EKS pod with IRSA sees it: a token file and the role, no keys; the connection's region."""
    for name in ("IMGEST_S3_CREDENTIALS_FILE", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    (folder / "token").write_text(TOKEN)
    monkeypatch.setenv("AWS_ROLE_ARN", role_arn)
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(folder / "token"))
    monkeypatch.setenv("AWS_ROLE_SESSION_NAME", "pod")
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", aws.endpoint)
    monkeypatch.setenv("IMGEST_S3_ENDPOINT", aws.endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", aws.region)


def test_the_server_refuses_a_request_signed_for_another_region(aws: StrictAws) -> None:
    import urllib3
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest

    bucket = _bucket(aws, "west", "us-west-2")
    aws.client("s3").put_object(Bucket=bucket, Key="k", Body=b"v")  # boto3 in eu-west-1 follows the answer
    answers = {}
    for region in (aws.region, "us-west-2"):
        request = AWSRequest("GET", f"{aws.endpoint}/{bucket}/k")
        S3SigV4Auth(aws.admin().credentials(), "s3", region).add_auth(request)
        answer = urllib3.request("GET", request.url, headers=dict(request.headers.items()))
        answers[region] = (answer.status, answer.headers.get("x-amz-bucket-region"), answer.data)
    assert answers[aws.region][:2] == (400, "us-west-2")
    assert b"<Code>AuthorizationHeaderMalformed</Code>" in answers[aws.region][2]
    assert answers["us-west-2"] == (200, None, b"v")


def test_signed_gets_and_arrow_follow_the_buckets_region(aws: StrictAws) -> None:
    """imgest's own GETs (the executors' source reads) retry once signed for the region S3 names; Arrow's file
    system, which cannot, gets the region asked of the bucket (``for_bucket``)."""
    from imgest.core.bucket_region import bucket_region, for_bucket
    from imgest.core.staging import _filesystem
    from imgest.sources.s3getter import ObjectGetter

    bucket = _bucket(aws, "south", "ap-southeast-2")
    aws.client("s3").put_object(Bucket=bucket, Key="a/b.bin", Body=b"0123456789")
    settings = aws.admin()
    assert settings.region == aws.region
    getter = ObjectGetter(settings)
    assert getter.get(bucket, "a/b.bin", (2, 5)) == b"234"
    assert getter.get(bucket, "a/b.bin") == b"0123456789"  # no second refusal: the region is kept
    assert bucket_region(settings, bucket) == "ap-southeast-2"
    arrow = _filesystem(for_bucket(settings, bucket))
    assert arrow.open_input_file(f"{bucket}/a/b.bin").read() == b"0123456789"
    with pytest.raises(OSError, match=r"AuthorizationHeaderMalformed|region|400"):
        _filesystem(settings).open_input_file(f"{bucket}/a/b.bin").read()  # what Arrow did before


def test_a_pods_run_across_three_regions_publishes(
    aws: StrictAws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection in eu-west-1, the source in us-west-2, the shards and the run state in ap-southeast-2; only
    the web identity of a role whose policy names those two buckets: the scan, the staged plan (Arrow), the
    executors' GETs and the upload each sign for the bucket they touch."""
    from imgest.cli import main

    source, dest = _bucket(aws, "src", "us-west-2"), _bucket(aws, "dst", "ap-southeast-2")
    tree = tmp_path / "tree"
    write_sample(tree, SampleSpec("imagefolder", classes=3, per_class=4, val_per_class=1, seed=11))
    admin = aws.client("s3")
    for path in sorted(p for p in tree.rglob("*") if p.is_file()):
        admin.upload_file(str(path), source, "tree/" + path.relative_to(tree).as_posix())
    pod_env(monkeypatch, aws, aws.role(f"pod-{dest}", [source, dest]), tmp_path)
    monkeypatch.setenv("IMGEST_STATE_URL", f"s3://{dest}/_state")
    work = ["--work-dir", str(tmp_path / "work")]
    url = f"s3://{dest}/ds"
    assert main(["ingest", "shards", f"s3://{source}/tree/", "--dest", url, *work, "--max-count", "5"]) == 0
    manifest = json.loads(admin.get_object(Bucket=dest, Key="ds/manifest.json")["Body"].read())
    assert sum(s["samples"] for s in manifest["shards"]) == 15
    assert main(["verify", "shards", url]) == 0
    assert admin.list_objects_v2(Bucket=dest, Prefix="_state/staging/").get("KeyCount", 0) == 0
    assert admin.list_objects_v2(Bucket=source, Prefix="tree/").get("KeyCount") == 15  # the source untouched


def test_settings_without_a_region_header_keep_the_connections(aws: StrictAws) -> None:
    """A store that names no region (a refused HeadBucket without the header, or an S3 that never sends it):
    the connection's region stands."""
    from imgest.core.bucket_region import bucket_region

    keys = aws.assume(aws.role(f"none-{secrets.token_hex(3)}", ["nothing-here"]))
    assert bucket_region(S3Settings(**{**keys.__dict__, "region": "eu-central-1"}), "not-mine") == "eu-central-1"


def sessions_of(aws: StrictAws, role_arn: str) -> int:
    """How many sessions the server has issued for ROLE_ARN (moto's state, /moto-api/data.json)."""
    import urllib.request

    with urllib.request.urlopen(f"{aws.endpoint}/moto-api/data.json", timeout=30) as answer:
        sessions = json.loads(answer.read()).get("sts", {}).get("AssumedRole", [])
    return sum(1 for s in sessions if s.get("role_arn") == role_arn)


def test_a_pods_run_outlives_its_first_credentials(
    aws: StrictAws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The role's sessions last 4 s and the server refuses an expired one (400 ExpiredToken, as AWS does): a pod's
    whole run (IRSA: the token file and the role) stores, publishes and verifies, its run state in the bucket, every
    client renewing from the web identity as its keys run out; one session for the run would have been refused."""
    from dataclasses import replace

    from botocore.exceptions import ClientError

    from imgest.cli import main

    dest = _bucket(aws, "short", aws.region)
    role = aws.role(f"short-{dest}", [dest], session_s=4)
    first = replace(aws.assume(role, seconds=3600), expires_at=None)  # its keys as they are: no renewal
    first.client().put_object(Bucket=dest, Key="probe", Body=b"1")  # within its 4 s
    time.sleep(5)
    with pytest.raises(ClientError, match="ExpiredToken"):
        first.client().put_object(Bucket=dest, Key="probe", Body=b"2")
    tree = tmp_path / "tree"
    write_sample(tree, SampleSpec("imagefolder", classes=3, per_class=6, val_per_class=2, seed=12))
    pod_env(monkeypatch, aws, role, tmp_path)
    monkeypatch.setenv("IMGEST_STATE_URL", f"s3://{dest}/_state")
    url, began = f"s3://{dest}/ds", time.monotonic()
    assert main(["ingest", "shards", str(tree), "--dest", url, "--work-dir", str(tmp_path / "work")]) == 0
    assert main(["verify", "shards", url]) == 0
    assert time.monotonic() - began > 4  # the run outlived the session it started with
    admin = aws.client("s3")
    manifest = json.loads(admin.get_object(Bucket=dest, Key="ds/manifest.json")["Body"].read())
    assert sum(s["samples"] for s in manifest["shards"]) == 24
    sessions = sessions_of(aws, role)
    print(f"{sessions} sessions of {role} in {time.monotonic() - began:.1f} s")
    assert sessions >= 3  # the probe's, and the renewals of the run's
