"""A strict AWS for tests: moto's server (S3, IAM and STS in one process) with IAM authentication on.

SeaweedFS, the embedded default, accepts whatever its one key pair signs. AWS refuses more: temporary keys without
their session token, a bucket the role's policy does not name, a CreateBucket outside us-east-1 without its
LocationConstraint. moto's server enforces those once authentication is on (its ``/moto-api/reset-auth``): every
request must be signed by an IAM user's key or by a role's temporary keys with their token, and is allowed only by
the identity's policies.

``up`` starts it (``moto_server`` from its own virtual environment, ``$IMGEST_HOME/aws/venv``, built by
``scripts/build_strict_aws.sh`` in the test install: moto's Flask stack stays out of Airflow's environment; one
correction, ``strict_aws_server``: AssumeRoleWithWebIdentity is unsigned, as on AWS), creates
an administrator (IAM user ``imgest-admin``, keys kept in ``admin.json``, mode 0600) while authentication is still
off, then turns it on. ``role`` makes a role whose policy names some buckets alone; ``assume`` gives its temporary
keys, as IRSA or an instance role give a pod or a host. moto keeps its state in memory: a restart starts empty.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imgest.core.errors import ServiceError
from imgest.core.paths import state_dir
from imgest.core.settings import EMBEDDED_HOST, S3Settings, env_int
from imgest.services.base import ServiceStatus, UpResult
from imgest.services.process import ManagedProcess, port_open, require_free_port

log = logging.getLogger(__name__)
ADMIN = "imgest-admin"
REGION = "eu-west-1"  # the strict server's buckets live outside us-east-1, as most platforms' do
ADMIN_POLICY = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}


def trust_policy() -> dict[str, Any]:
    """Who may assume the roles: any principal of the account, by keys or by a web identity token (IRSA's way)."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"},
            {"Effect": "Allow", "Principal": {"Federated": "*"}, "Action": "sts:AssumeRoleWithWebIdentity"},
        ],
    }


def bucket_policy(buckets: list[str], actions: str | list[str] = "s3:*") -> dict[str, Any]:
    """An identity policy allowing ACTIONS (every S3 action by default) on BUCKETS and their objects, nothing else."""
    resources = [f"arn:aws:s3:::{b}" for b in buckets] + [f"arn:aws:s3:::{b}/*" for b in buckets]
    return {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": resources}]}


def moto_binary() -> Path:
    """moto_server from the strict server's own environment."""
    path = state_dir() / "aws" / "venv" / "bin" / "moto_server"
    if not path.is_file():
        raise ServiceError(f"aws: {path} is missing; run `make install-dev` (scripts/build_strict_aws.sh builds it)")
    return path


@dataclass(frozen=True)
class StrictAws:
    """moto's server on HOST:PORT with IAM authentication on; its administrator's keys in HOME/admin.json."""

    home: Path
    port: int = 5050
    host: str = EMBEDDED_HOST
    region: str = REGION
    name: str = "aws"

    @classmethod
    def default(cls) -> StrictAws:
        return cls(home=state_dir() / "aws", port=env_int("IMGEST_AWS_PORT", 5050))

    @property
    def process(self) -> ManagedProcess:
        return ManagedProcess(self.name, self.home / "moto.pid", self.home / "logs" / "moto.log")

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def admin(self) -> S3Settings:
        """The administrator's settings (static keys), for setting roles and buckets up."""
        data = json.loads((self.home / "admin.json").read_text())
        return S3Settings(
            endpoint_url=self.endpoint, access_key=data["key"], secret_key=data["secret"], region=self.region
        )

    def client(self, service: str, settings: S3Settings | None = None) -> Any:
        """A boto3 client of SERVICE (iam, sts, s3) signed with SETTINGS (default: the administrator)."""
        import boto3

        settings = settings or self.admin()
        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id=settings.access_key,
            aws_secret_access_key=settings.secret_key,
            aws_session_token=settings.session_token,
        )

    def role(
        self, name: str, buckets: list[str], actions: str | list[str] = "s3:*", session_s: int | None = None
    ) -> str:
        """A role (made or replaced) whose only policy allows ACTIONS on BUCKETS; returns its ARN. SESSION_S: its
        sessions last that many seconds (the server's tag; AWS's shortest is 900)."""
        iam = self.client("iam")
        try:
            iam.delete_role_policy(RoleName=name, PolicyName="buckets")
            iam.delete_role(RoleName=name)
        except iam.exceptions.NoSuchEntityException:
            pass
        tags = [{"Key": "imgest-session-seconds", "Value": str(session_s)}] if session_s else []
        trust = json.dumps(trust_policy())
        arn = iam.create_role(RoleName=name, AssumeRolePolicyDocument=trust, Tags=tags)["Role"]["Arn"]
        policy = json.dumps(bucket_policy(buckets, actions))
        iam.put_role_policy(RoleName=name, PolicyName="buckets", PolicyDocument=policy)
        return str(arn)

    def assume(self, role_arn: str, seconds: int = 3600, session: str = "imgest") -> S3Settings:
        """ROLE_ARN's temporary keys (key, secret, session token, expiry), as settings of this endpoint."""
        creds = self.client("sts").assume_role(RoleArn=role_arn, RoleSessionName=session, DurationSeconds=seconds)
        c = creds["Credentials"]
        return S3Settings(
            endpoint_url=self.endpoint,
            access_key=c["AccessKeyId"],
            secret_key=c["SecretAccessKey"],
            session_token=c["SessionToken"],
            region=self.region,
            expires_at=c["Expiration"].timestamp(),
        )

    def _no_auth_actions(self, count: int) -> None:
        """How many requests from now on moto serves unauthenticated (its /moto-api/reset-auth; 0: none)."""
        request = urllib.request.Request(
            f"{self.endpoint}/moto-api/reset-auth",
            data=str(count).encode(),
            headers={"Content-Type": "text/plain"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def bootstrap(self) -> None:
        """With authentication off: the administrator and its keys (admin.json, 0600); then authentication on."""
        import boto3

        self._no_auth_actions(1_000_000)
        iam = boto3.client(
            "iam", endpoint_url=self.endpoint, region_name=self.region, aws_access_key_id="bootstrap",
            aws_secret_access_key="bootstrap",
        )  # fmt: skip
        iam.create_user(UserName=ADMIN)
        iam.put_user_policy(UserName=ADMIN, PolicyName="admin", PolicyDocument=json.dumps(ADMIN_POLICY))
        key = iam.create_access_key(UserName=ADMIN)["AccessKey"]
        path = self.home / "admin.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"key": key["AccessKeyId"], "secret": key["SecretAccessKey"]}, fh)
        self._no_auth_actions(0)

    def answers(self) -> bool:
        """True when the administrator's signed GetCallerIdentity succeeds (authentication on)."""
        if not port_open(self.host, self.port) or not (self.home / "admin.json").is_file():
            return False
        try:
            self.client("sts").get_caller_identity()
            return True
        except Exception as exc:  # any botocore error means "not ready" (or a server restarted empty)
            log.debug("aws not answering on %s: %s", self.endpoint, exc)
            return False

    def up(self, timeout: float = 60.0) -> UpResult:
        """Start the server unless it runs; create the administrator; turn authentication on."""
        if self.process.pid() is not None and self.answers():
            return UpResult(self.name, False, 0.0, f"aws (moto) already running on {self.endpoint}")
        if self.process.pid() is None:
            require_free_port(self.name, self.host, self.port, "IMGEST_AWS_PORT")
            (self.home / "logs").mkdir(parents=True, exist_ok=True)
            (self.home / "admin.json").unlink(missing_ok=True)
            python = moto_binary().parent / "python"  # moto's server with the STS correction (strict_aws_server)
            cmd = [
                str(python),
                str(Path(__file__).with_name("strict_aws_server.py")),
                "-H",
                self.host,
                "-p",
                str(self.port),
            ]
            self.process.start(cmd, cwd=self.home)
        waited = self.process.wait_ready(lambda: port_open(self.host, self.port), timeout, f"moto on {self.endpoint}")
        if not self.answers():
            self.bootstrap()
        return UpResult(
            self.name,
            True,
            waited,
            f"aws (moto {self.version()}: S3, IAM, STS; IAM authentication on) answers on {self.endpoint} after "
            f"{waited:.1f}s; region {self.region}; administrator keys in {self.home / 'admin.json'}",
        )

    def version(self) -> str:
        venv = moto_binary().parent.parent
        found = sorted(venv.glob("lib/python*/site-packages/moto-*.dist-info"))
        return found[-1].name.removesuffix(".dist-info").split("-")[1] if found else "?"

    def down(self) -> bool:
        return self.process.stop()

    def status(self) -> ServiceStatus:
        return ServiceStatus(self.name, self.endpoint, self.process.pid(), self.answers(), "IAM authentication on")
