"""The hosts' object store as AWS is for a team on EKS: the strict AWS (imgest.services.strict_aws) on the store
host, and on every other host no key at all, only a web identity of its own, as IRSA gives a pod.

The deployer (root namespace) makes the buckets (in the server's region, eu-west-1) and, for each host, a role whose
policy names those buckets alone (``imgest-host-<host>``) and a token file in the host's own folder
(``$IMGEST_HOME/irsa/token`` inside it). A host's processes get ``AWS_ROLE_ARN``, ``AWS_WEB_IDENTITY_TOKEN_FILE``,
``AWS_ROLE_SESSION_NAME``, ``AWS_ENDPOINT_URL_STS`` and the region: botocore's chain exchanges the token at STS for
the role's temporary keys, renewed by the chain itself; Spark executors inherit their worker's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from imgest.services.hosts_servers import InHost
from imgest.services.strict_aws import StrictAws

BUCKETS = ("imgest", "imgest-src")  # the run state and destinations; the S3 sources
ACCOUNT = "123456789012"  # moto's account
TOKEN = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6aW1nZXN0In0."  # an unsigned JWT, as moto takes
TOKEN_PATH = "irsa/token"  # under the host's state folder


@dataclass(frozen=True)
class HostAws(StrictAws, InHost):
    """The strict AWS inside a host."""

    @property
    def process(self):  # -> HostProcess
        return self.moved(super().process)


def role_name(host: str) -> str:
    return f"imgest-host-{host}"


def identity_env(host: str, state: Path, endpoint: str, region: str) -> dict[str, str]:
    """What HOST's processes hold of AWS: their web identity (a token file at STATE/irsa/token, as the host sees its
    state folder), the role it is exchanged for, STS's endpoint and the region; no key."""
    return {
        "AWS_ROLE_ARN": f"arn:aws:iam::{ACCOUNT}:role/{role_name(host)}",
        "AWS_WEB_IDENTITY_TOKEN_FILE": str(state / TOKEN_PATH),
        "AWS_ROLE_SESSION_NAME": host,
        "AWS_ENDPOINT_URL_STS": endpoint,
        "AWS_DEFAULT_REGION": region,
        "AWS_EC2_METADATA_DISABLED": "true",  # nothing to ask: no instance metadata on these hosts
    }


def bootstrap(aws: StrictAws, homes: dict[str, Path]) -> None:
    """The buckets, and for each host of HOMES (name -> its own folder, root view) its role and token file."""
    s3 = aws.client("s3")
    made = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
    for bucket in BUCKETS:
        if bucket not in made:
            s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": aws.region})
    for host, home in homes.items():
        aws.role(role_name(host), list(BUCKETS))
        token = home / TOKEN_PATH
        token.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(TOKEN)
