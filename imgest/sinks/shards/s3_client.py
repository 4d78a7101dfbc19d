"""S3 access checks that turn botocore errors into messages naming endpoint, bucket and key id."""

from __future__ import annotations

from typing import Any

from imgest.core.errors import AuthenticationError, ImgestError
from imgest.core.settings import S3Settings

AUTH_ERROR_CODES = frozenset({"SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied", "403"})


class S3AccessError(ImgestError):
    """The S3 endpoint refused the credentials, or the bucket is missing or unreachable."""


class S3AuthError(S3AccessError, AuthenticationError):
    """The S3 endpoint refused the credentials (retrying cannot help)."""


def describe_client_error(settings: S3Settings, bucket: str, exc: Exception) -> S3AccessError:
    """An S3AccessError for EXC that names what failed and what to check; never includes the secret."""
    code = ""
    response: Any = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = str(response.get("Error", {}).get("Code", ""))
    key = settings.access_key or "from botocore's chain"
    where = f"S3 at {settings.endpoint_url or 'AWS'} (bucket {bucket!r}, access key id {key!r})"
    if type(exc).__name__ == "NoCredentialsError":
        return S3AuthError(
            f"{where}: no credentials found: set the Airflow connection aws_default's keys, AWS_ACCESS_KEY_ID / "
            "AWS_SECRET_ACCESS_KEY, a profile (AWS_PROFILE) or a role; a store other than AWS also needs "
            'IMGEST_S3_ENDPOINT (the embedded one: eval "$(imgest services env)")'
        )
    if code in ("AccessDenied", "403"):
        return S3AuthError(
            f"{where} refused the credentials ({code}): a wrong key pair, or policies (the identity's or the "
            "bucket's) that do not allow this bucket; check the keys in the Airflow connection aws_default or "
            "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, and that the role may use this bucket"
        )
    if code in AUTH_ERROR_CODES:
        return S3AuthError(
            f"{where} refused the credentials ({code}); check the key pair in the Airflow "
            "connection aws_default or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
        )
    if code in {"NoSuchBucket", "404"}:
        return S3AccessError(f"{where}: the bucket does not exist; create it or choose another destination")
    return S3AccessError(f"{where} failed: {code or type(exc).__name__}: {exc}")


def check_access(settings: S3Settings, bucket: str) -> None:
    """Raise S3AccessError unless a signed HeadBucket on BUCKET succeeds."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        settings.client().head_bucket(Bucket=bucket)
    except (ClientError, BotoCoreError) as exc:
        raise describe_client_error(settings, bucket, exc) from None


def create_bucket_args(settings: S3Settings, bucket: str) -> dict[str, Any]:
    """CreateBucket's arguments for BUCKET in the settings' region: outside us-east-1 S3 refuses a bucket without
    its LocationConstraint (IllegalLocationConstraintException)."""
    args: dict[str, Any] = {"Bucket": bucket}
    if settings.region and settings.region != "us-east-1":
        args["CreateBucketConfiguration"] = {"LocationConstraint": settings.region}
    return args


def ensure_bucket(settings: S3Settings, bucket: str) -> bool:
    """Create BUCKET (in the settings' region) if it does not exist; True if it was created. Refused credentials
    raise S3AccessError; so does a CreateBucket the identity may not make, naming the bucket and the region."""
    from botocore.exceptions import BotoCoreError, ClientError

    client = settings.client()
    try:
        client.head_bucket(Bucket=bucket)
        return False
    except ClientError as exc:
        if str(exc.response.get("Error", {}).get("Code")) not in ("404", "NoSuchBucket", "NotFound"):
            raise describe_client_error(settings, bucket, exc) from None
    except BotoCoreError as exc:
        raise describe_client_error(settings, bucket, exc) from None
    try:
        client.create_bucket(**create_bucket_args(settings, bucket))
    except ClientError as exc:
        if str(exc.response.get("Error", {}).get("Code")) in ("AccessDenied", "403"):
            raise S3AuthError(
                f"S3 at {settings.endpoint_url or 'AWS'}: bucket {bucket!r} does not exist and these credentials may "
                f"not create it (AccessDenied); create it in {settings.region} beforehand, or allow the identity "
                "s3:CreateBucket on it"
            ) from None
        raise describe_client_error(settings, bucket, exc) from None
    except BotoCoreError as exc:
        raise describe_client_error(settings, bucket, exc) from None
    return True
