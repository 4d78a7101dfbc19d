"""Against an S3 that refuses what AWS refuses (moto's server with IAM authentication on, `imgest services up aws`):
the server itself refuses keys without their session token, buckets outside a role's policy and a CreateBucket
without its region's LocationConstraint; and a team's first run with only a role's temporary keys, the run state in
the role's bucket, stores and publishes its shards (it failed on the staged shard plan: Arrow's S3 filesystem got
key and secret but never the session token)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from imgest.core.settings import S3Settings
from imgest.services.strict_aws import StrictAws
from imgest.sources.devdata.sample import SampleSpec, write_sample
from tests.conftest import serve

pytestmark = pytest.mark.services


@pytest.fixture(scope="module")
def aws() -> Iterator[StrictAws]:
    yield from serve("aws")  # type: ignore[misc]


@pytest.fixture(scope="module")
def role_keys(aws: StrictAws) -> tuple[str, S3Settings]:
    """A bucket of the server's region and the temporary keys of a role whose policy names that bucket alone."""
    bucket = f"data-{secrets.token_hex(3)}"
    aws.client("s3").create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": aws.region})
    arn = aws.role(f"ingest-{bucket}", [bucket])
    return bucket, aws.assume(arn)


def _code(exc: pytest.ExceptionInfo[ClientError]) -> str:
    return str(exc.value.response["Error"]["Code"])


def test_the_server_refuses_what_aws_refuses(aws: StrictAws, role_keys: tuple[str, S3Settings]) -> None:
    bucket, keys = role_keys
    s3 = aws.client("s3", keys)
    s3.put_object(Bucket=bucket, Key="probe", Body=b"x")  # the role's own bucket, with its token
    assert s3.get_object(Bucket=bucket, Key="probe")["Body"].read() == b"x"
    without_token = S3Settings(endpoint_url=aws.endpoint, access_key=keys.access_key, secret_key=keys.secret_key)
    with pytest.raises(ClientError) as refused:
        aws.client("s3", without_token).get_object(Bucket=bucket, Key="probe")
    assert _code(refused) == "InvalidAccessKeyId"  # as AWS answers temporary keys sent without their token
    wrong = S3Settings(**{**without_token.__dict__, "session_token": "not-the-token"})
    with pytest.raises(ClientError) as refused:
        aws.client("s3", wrong).get_object(Bucket=bucket, Key="probe")
    assert _code(refused) == "InvalidToken"
    other = f"other-{secrets.token_hex(3)}"
    aws.client("s3").create_bucket(Bucket=other, CreateBucketConfiguration={"LocationConstraint": aws.region})
    with pytest.raises(ClientError) as outside:
        s3.put_object(Bucket=other, Key="k", Body=b"x")
    assert _code(outside) == "AccessDenied"
    with pytest.raises(ClientError) as no_region:
        aws.client("s3").create_bucket(Bucket=f"noregion-{secrets.token_hex(3)}")
    assert _code(no_region) == "IllegalLocationConstraintException"


@pytest.mark.parametrize("how", ["exported keys", "web identity"])
def test_a_first_ingest_with_only_a_roles_temporary_keys_publishes(
    how: str,
    aws: StrictAws,
    role_keys: tuple[str, S3Settings],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The issue's run: `imgest ingest shards` from a local sample, the state in the role's bucket
    (IMGEST_STATE_URL, as on hosts that share nothing), with the role's temporary keys exported as the docs say, or
    as IRSA gives a pod (AWS_ROLE_ARN and a web identity token file; botocore's chain exchanges it at STS): it
    stores, verifies and publishes, and the shard plan went through the bucket."""
    from imgest.cli import main

    bucket, keys = role_keys
    write_sample(tmp_path / "tree", SampleSpec("imagefolder", classes=3, per_class=4, val_per_class=1, seed=7))
    for name in ("IMGEST_S3_CREDENTIALS_FILE", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("IMGEST_S3_ENDPOINT", aws.endpoint)
    if how == "exported keys":
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", str(keys.access_key))
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", str(keys.secret_key))
        monkeypatch.setenv("AWS_SESSION_TOKEN", str(keys.session_token))
    else:
        (tmp_path / "token").write_text("eyJhbGciOiJub25lIn0.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6aW5nZXN0In0.")
        monkeypatch.setenv("AWS_ROLE_ARN", aws.role(f"pod-{bucket}", [bucket]))
        monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(tmp_path / "token"))
        monkeypatch.setenv("AWS_ROLE_SESSION_NAME", "pod")
        monkeypatch.setenv("AWS_ENDPOINT_URL_STS", aws.endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", aws.region)
    monkeypatch.setenv("IMGEST_S3_BUCKET", bucket)
    monkeypatch.setenv("IMGEST_STATE_URL", f"s3://{bucket}/_state")
    dest = f"s3://{bucket}/ds-{how.split()[0]}"
    work = ["--work-dir", str(tmp_path / "work")]
    assert main(["ingest", "shards", str(tmp_path / "tree"), "--dest", dest, *work, "--max-count", "5"]) == 0
    s3 = aws.client("s3", keys)
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=f"ds-{how.split()[0]}/manifest.json")["Body"].read())
    assert sum(s["samples"] for s in manifest["shards"]) == 15
    assert main(["verify", "shards", dest]) == 0
    staged = s3.list_objects_v2(Bucket=bucket, Prefix="_state/staging/").get("KeyCount", 0)
    assert staged == 0  # the staged plan was read by the executors and removed at the job's end


def test_a_bucket_is_made_in_the_regions_location(aws: StrictAws) -> None:
    """S3 refuses a CreateBucket outside us-east-1 without its LocationConstraint: the prepare step makes the bucket
    in the connection's region."""
    from imgest.sinks.shards.s3_client import ensure_bucket

    bucket = f"made-{secrets.token_hex(3)}"
    assert ensure_bucket(aws.admin(), bucket) is True
    assert aws.client("s3").get_bucket_location(Bucket=bucket)["LocationConstraint"] == aws.region
    assert ensure_bucket(aws.admin(), bucket) is False  # there already: nothing made


def test_a_bucket_outside_the_roles_policy_is_named_and_nothing_is_made(
    aws: StrictAws, role_keys: tuple[str, S3Settings]
) -> None:
    from imgest.sinks.shards.s3_client import S3AuthError, ensure_bucket

    _, keys = role_keys
    bucket = f"outside-{secrets.token_hex(3)}"
    with pytest.raises(S3AuthError) as refused:
        ensure_bucket(keys, bucket)
    text = str(refused.value)
    assert f"bucket {bucket!r}" in text
    assert "(403)" in text or "(AccessDenied)" in text  # HeadBucket answers a bare 403, as on AWS
    assert "policies" in text
    assert str(keys.secret_key) not in text
    assert str(keys.session_token) not in text
    with pytest.raises(ClientError) as missing:
        aws.client("s3").head_bucket(Bucket=bucket)
    assert _code(missing) == "404"


def test_a_create_bucket_the_role_may_not_make_names_bucket_and_region(aws: StrictAws) -> None:
    """A role that may look at a bucket but not create it: HeadBucket says it is missing, CreateBucket is refused;
    the error says which bucket, where, and what to do."""
    from imgest.sinks.shards.s3_client import S3AuthError, ensure_bucket

    bucket = f"nocreate-{secrets.token_hex(3)}"
    # AWS's HeadBucket needs s3:ListBucket; moto asks for an action of its own, s3:HeadBucket
    keys = aws.assume(aws.role(f"look-{bucket}", [bucket], ["s3:ListBucket", "s3:HeadBucket"]))
    with pytest.raises(S3AuthError) as refused:
        ensure_bucket(keys, bucket)
    text = str(refused.value)
    assert f"bucket {bucket!r} does not exist and these credentials may not create it (AccessDenied)" in text
    assert f"create it in {aws.region} beforehand" in text
    with pytest.raises(ClientError) as missing:
        aws.client("s3").head_bucket(Bucket=bucket)
    assert _code(missing) == "404"


def _shipped(keys: S3Settings, role_arn: str | None) -> S3Settings:
    """KEYS as a job ships them, about to expire (the clock driven: inside the renewal window)."""
    import time

    return S3Settings(**{**keys.__dict__, "expires_at": time.time() + 60, "role_arn": role_arn})


def test_keys_about_to_expire_renew_from_the_connections_role(
    aws: StrictAws, role_keys: tuple[str, S3Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's own credentials (here: keys of its own in the environment, as a node role) assume the
    connection's role again: new keys of that role, still limited to its bucket."""
    bucket, _ = role_keys
    arn = aws.role(f"renew-{bucket}", [bucket])
    first = aws.assume(arn)
    admin = aws.admin()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", str(admin.access_key))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", str(admin.secret_key))
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", aws.endpoint)
    shipped = _shipped(first, arn)
    client = shipped.client()
    client.put_object(Bucket=bucket, Key="renewed", Body=b"r")
    renewed = shipped.credentials().get_frozen_credentials()
    assert renewed.access_key.startswith("ASIA")
    assert renewed.access_key not in (first.access_key, admin.access_key)  # the role's new keys, not the host's
    with pytest.raises(ClientError) as outside:
        client.put_object(Bucket=f"elsewhere-{secrets.token_hex(3)}", Key="k", Body=b"x")
    assert _code(outside) in ("AccessDenied", "NoSuchBucket")


def test_keys_the_environment_holds_are_no_renewal(role_keys: tuple[str, S3Settings], monkeypatch: pytest.MonkeyPatch):
    """spark-submit's environment carries the shipped keys to the driver: its chain finds those very keys, which
    must not pass for renewed ones (they used to be stamped valid for another hour)."""
    from imgest.core.errors import ConfigError

    _, keys = role_keys
    for name in ("AWS_PROFILE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", str(keys.access_key))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", str(keys.secret_key))
    monkeypatch.setenv("AWS_SESSION_TOKEN", str(keys.session_token))
    with pytest.raises(ConfigError, match=r"expire at .* and this host has none of its own"):
        _shipped(keys, None).credentials().get_frozen_credentials()


def test_a_role_the_host_may_no_longer_assume_stops_the_next_request_saying_what_expired(
    aws: StrictAws, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host (an IAM user of its own, allowed sts:AssumeRole on the connection's role) renews once; its right to
    assume the role is then taken away mid-run: the next request that needs new keys stops with an error naming
    the role and when the shipped keys expire, and writes nothing. (moto lets anyone allowed sts:AssumeRole assume
    a deleted role, so the right is what is removed here.)"""
    import json

    from imgest.core.errors import ConfigError

    bucket = f"gone-{secrets.token_hex(3)}"
    aws.client("s3").create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": aws.region})
    arn = aws.role(f"gone-{bucket}", [bucket])
    iam = aws.client("iam")
    node = f"node-{bucket}"
    iam.create_user(UserName=node)
    may_assume = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole", "Resource": arn}],
    }
    iam.put_user_policy(UserName=node, PolicyName="assume", PolicyDocument=json.dumps(may_assume))
    key = iam.create_access_key(UserName=node)["AccessKey"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", aws.endpoint)
    _shipped(aws.assume(arn), arn).client().put_object(Bucket=bucket, Key="before", Body=b"x")  # renewed: fine
    iam.delete_user_policy(UserName=node, PolicyName="assume")
    with pytest.raises(ConfigError) as stopped:
        _shipped(aws.assume(arn), arn).client().put_object(Bucket=bucket, Key="after", Body=b"x")
    text = str(stopped.value)
    assert "expire at " in text
    assert f"role {arn} could not be assumed again to renew them" in text
    assert "AccessDenied" in text
    keys = [o["Key"] for o in aws.client("s3").list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert keys == ["before"]  # nothing written after the right was taken away


def test_keys_from_a_profile_renew_from_that_profile(
    aws: StrictAws, role_keys: tuple[str, S3Settings], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver resolved its keys from a profile (the connection's profile_name, or AWS_PROFILE: here one that
    assumes a role from a user's keys, as SSO's and role profiles do); a host with that profile renews from it,
    not from the shipped keys its environment holds: new keys of the profile's role."""
    bucket, _ = role_keys
    arn = aws.role(f"profile-{bucket}", [bucket])
    iam = aws.client("iam")
    user = f"dev-{bucket}"
    iam.create_user(UserName=user)
    may = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole", "Resource": arn}]}
    iam.put_user_policy(UserName=user, PolicyName="assume", PolicyDocument=json.dumps(may))
    key = iam.create_access_key(UserName=user)["AccessKey"]
    (tmp_path / "config").write_text(f"[profile team]\nrole_arn = {arn}\nsource_profile = dev\n\n[profile dev]\n")
    (tmp_path / "credentials").write_text(
        f"[dev]\naws_access_key_id = {key['AccessKeyId']}\naws_secret_access_key = {key['SecretAccessKey']}\n"
    )
    first = aws.assume(arn)
    for name, value in {
        "AWS_CONFIG_FILE": str(tmp_path / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"),
        "AWS_ENDPOINT_URL_STS": aws.endpoint,
        "AWS_ACCESS_KEY_ID": str(first.access_key),  # spark-submit's environment: the shipped keys
        "AWS_SECRET_ACCESS_KEY": str(first.secret_key),
        "AWS_SESSION_TOKEN": str(first.session_token),
    }.items():
        monkeypatch.setenv(name, value)
    shipped = S3Settings(**{**_shipped(first, None).__dict__, "profile": "team"})
    renewed = shipped.credentials().get_frozen_credentials()
    assert renewed.access_key.startswith("ASIA")
    assert renewed.access_key not in (first.access_key, key["AccessKeyId"])  # the profile's role, freshly assumed
    shipped.client().put_object(Bucket=bucket, Key="from-profile", Body=b"p")
    assert aws.client("s3").get_object(Bucket=bucket, Key="from-profile")["Body"].read() == b"p"
