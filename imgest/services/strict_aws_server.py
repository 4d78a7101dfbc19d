"""moto's server as the strict AWS runs it (imgest.services.strict_aws): run by the Python of moto's own environment
(``<state>/aws/venv/bin/python strict_aws_server.py -H HOST -p PORT``), never imported by imgest.

Two corrections to moto 5.2.5 with IAM authentication on:
- it authenticates STS's AssumeRoleWithWebIdentity and AssumeRoleWithSAML too, which AWS serves unsigned (the token
  is the credential; a pod with IRSA has no keys to sign with), and answers them with a 500 (no Authorization
  header). Every other request stays authenticated.
- it serves a bucket whatever region a request is signed for. AWS refuses such a request: 400
  AuthorizationHeaderMalformed naming the bucket's region (in the body's ``<Region>`` and the
  ``x-amz-bucket-region`` header; a HEAD gets the header alone). Clients that sign for the connection's region
  and never ask the bucket's (Arrow's S3 filesystem, DALI's AWS SDK, a hand-made signer) fail on AWS; here too.
- it serves temporary credentials after they expired. AWS refuses them: 400 ``ExpiredToken`` ("The provided token
  has expired."). Here too; and a role tagged ``imgest-session-seconds`` gets sessions that short (AWS's shortest is
  15 minutes), so a test run outlives its first credentials in seconds.
"""

from __future__ import annotations

import re
import sys
from typing import Any

UNSIGNED_ACTIONS = ("AssumeRoleWithWebIdentity", "AssumeRoleWithSAML")
SESSION_TAG = "imgest-session-seconds"
SCOPE = re.compile(r"Credential=[^/,\s]+/\d{8}/([^/]+)/s3/aws4_request")
QUERY_SCOPE = re.compile(r"X-Amz-Credential=[^&%]+(?:/|%2F)\d{8}(?:/|%2F)([^/&%]+)(?:/|%2F)s3")


def bucket_region(name: str) -> str | None:
    """The region of moto's bucket NAME in any account, None when there is no such bucket."""
    from moto.s3.models import s3_backends

    for account in list(s3_backends.keys()):
        for partition in list(s3_backends[account].keys()):
            bucket = s3_backends[account][partition].buckets.get(name)
            if bucket is not None:
                return str(bucket.region_name)
    return None


def wrong_region(environ: dict[str, Any]) -> tuple[str, str] | None:
    """(signed region, bucket region) of an S3 request signed for another region than its bucket's; else None."""
    auth = environ.get("HTTP_AUTHORIZATION", "")
    found = SCOPE.search(auth) or QUERY_SCOPE.search(environ.get("QUERY_STRING", ""))
    bucket = environ.get("PATH_INFO", "/").lstrip("/").split("/", 1)[0]
    if found is None or not bucket or bucket == "moto-api":
        return None
    region = bucket_region(bucket)
    return (found.group(1), region) if region and region != found.group(1) else None


def refuse_wrong_region(app: Any) -> Any:
    """APP (moto's WSGI dispatcher) answering S3 requests signed for another region than the bucket's as AWS does."""

    def serve(environ: dict[str, Any], start_response: Any) -> Any:
        mismatch = wrong_region(environ)
        if mismatch is None:
            return app(environ, start_response)
        signed, region = mismatch
        body = (
            '<?xml version="1.0" encoding="UTF-8"?><Error><Code>AuthorizationHeaderMalformed</Code><Message>The '
            f"authorization header is malformed; the region '{signed}' is wrong; expecting '{region}'</Message>"
            f"<Region>{region}</Region><RequestId>imgest-strict</RequestId></Error>"
        ).encode()
        body = b"" if environ.get("REQUEST_METHOD") == "HEAD" else body
        start_response(
            "400 Bad Request",
            [("Content-Type", "application/xml"), ("x-amz-bucket-region", region), ("Content-Length", str(len(body)))],
        )
        return [body]

    return serve


def _tag_value(tags: Any, key: str) -> str | None:
    """The value of KEY among a moto role's tags (a dict of {"Key", "Value"} entries by key, or a list of them)."""
    entries = tags.values() if isinstance(tags, dict) else tags or []
    return next((str(t.get("Value")) for t in entries if isinstance(t, dict) and t.get("Key") == key), None)


def expire_sessions() -> None:
    """Sessions of roles tagged SESSION_TAG last that many seconds; expired session credentials are refused."""
    import datetime

    from moto.core.utils import utcnow
    from moto.iam import access_control
    from moto.iam.models import iam_backends
    from moto.s3.exceptions import S3ClientError
    from moto.sts import models as sts_models

    made = sts_models.AssumedRole.__init__

    def short_session(self: Any, account_id: str, *args: Any, **kwargs: Any) -> None:
        made(self, account_id, *args, **kwargs)
        for backend in iam_backends[account_id].values():
            role = next((r for r in backend.roles.values() if r.arn == self.role_arn), None)
            seconds = _tag_value(role.tags, SESSION_TAG) if role is not None else None
            if seconds:
                self.expiration = min(self.expiration, utcnow() + datetime.timedelta(seconds=int(seconds)))

    sts_models.AssumedRole.__init__ = short_session  # type: ignore[method-assign]
    key_of = access_control.AssumedRoleAccessKey.__init__

    def refuse_expired(self: Any, account_id: str, partition: str, access_key_id: str, headers: Any) -> None:
        key_of(self, account_id, partition, access_key_id, headers)
        for assumed in sts_models.sts_backends[account_id][partition].assumed_roles:
            if assumed.access_key_id == access_key_id and assumed.expiration < utcnow():
                raise S3ClientError("ExpiredToken", "The provided token has expired.")

    access_control.AssumedRoleAccessKey.__init__ = refuse_expired  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    """moto's server with the corrections in place."""
    expire_sessions()
    from moto.core import authorization  # the aws venv's moto

    mixin = authorization.ActionAuthenticatorMixin
    authenticate = mixin._authenticate_and_authorize_normal_action

    def unsigned_sts_as_aws(self: object, resource: str = "*") -> None:
        if self._get_action() in UNSIGNED_ACTIONS:  # type: ignore[attr-defined]
            return
        authenticate(self, resource)  # type: ignore[arg-type]

    mixin._authenticate_and_authorize_normal_action = unsigned_sts_as_aws  # type: ignore[method-assign]
    import moto.server
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    dispatch = DomainDispatcherApplication.__call__

    def dispatch_as_aws(self: Any, environ: dict[str, Any], start_response: Any) -> Any:
        return refuse_wrong_region(lambda e, r: dispatch(self, e, r))(environ, start_response)

    DomainDispatcherApplication.__call__ = dispatch_as_aws  # type: ignore[method-assign]
    serve = moto.server.main

    serve(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
