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
"""

from __future__ import annotations

import re
import sys
from typing import Any

UNSIGNED_ACTIONS = ("AssumeRoleWithWebIdentity", "AssumeRoleWithSAML")
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


def main(argv: list[str]) -> None:
    """moto's server with the correction in place."""
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
