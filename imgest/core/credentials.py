"""S3 credentials as AWS users have them: given keys, or botocore's default chain, with temporary ones renewed.

``botocore_credentials`` turns ``S3Settings`` into what botocore signs with:
- no keys: botocore's default chain of this process (environment, shared config and profiles, SSO, web identity,
  container and instance metadata), which renews temporary credentials itself;
- keys without an expiry: those keys (and their session token, when they have one);
- keys with an expiry (temporary keys a Spark driver or an Airflow task resolved and shipped inside the task
  objects): those keys until ``RENEW_BEFORE_S`` before they expire, then this host's own chain (the role every
  executor of a Kubernetes or EC2 deployment has). A host with no credentials of its own fails then with an
  error that says when the shipped ones expired and what to give the host.

``frozen_settings`` is the driver's side: the chain's current keys, token and expiry, put into the settings that
travel to executors (inside pickled tasks, never in Spark conf, argv or logs).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from imgest.core.errors import ConfigError

log = logging.getLogger(__name__)
RENEW_BEFORE_S = 600.0  # shipped temporary credentials are renewed this long before they expire
S3Settings = Any  # imgest.core.settings.S3Settings, which builds on this module (it is not imported here)


def _chain() -> Any:
    """This process's botocore default credential chain (None when it finds nothing)."""
    from botocore.session import get_session

    return get_session().get_credentials()


def expiry_of(credentials: Any) -> float | None:
    """When CREDENTIALS expire (epoch seconds), None for keys that do not."""
    when = getattr(credentials, "_expiry_time", None)
    return when.timestamp() if isinstance(when, datetime) else None


def _own_chain(shipped_key: str | None, profile: str | None = None, region: str | None = None) -> Any:
    """This host's own credentials, never the shipped ones: PROFILE's when this host's shared config has it (an SSO
    session, a profile with a role_arn: resolved again), else botocore's chain without its environment provider when
    the environment holds shipped keys (spark-submit's environment carries them to the driver: these, or temporary
    ones imgest shipped earlier, marked by IMGEST_S3_CREDENTIALS_EXPIRY, which expire with the session they came
    from); None if empty."""
    import os

    from botocore.session import get_session

    session = get_session()
    if profile and profile in session.available_profiles:
        session.set_config_variable("profile", profile)
        if region and not session.get_config_variable("region"):  # STS for a role profile needs one
            session.set_config_variable("region", region)
        session.get_component("credential_provider").remove("env")  # the profile's, not the environment's
        return session.get_credentials()
    shipped_here = os.environ.get("IMGEST_S3_CREDENTIALS_EXPIRY") and os.environ.get("AWS_SESSION_TOKEN")
    if (shipped_key and os.environ.get("AWS_ACCESS_KEY_ID") == shipped_key) or shipped_here:
        session.get_component("credential_provider").remove("env")
    return session.get_credentials()


def _assume(role_arn: str, base: Any, settings: S3Settings) -> Any:
    """ROLE_ARN's new temporary keys, asked of STS with BASE (this host's own credentials)."""
    import botocore.session
    from botocore.credentials import Credentials

    frozen = base.get_frozen_credentials()
    sts = botocore.session.get_session().create_client(
        "sts",
        region_name=settings.region,
        aws_access_key_id=frozen.access_key,
        aws_secret_access_key=frozen.secret_key,
        aws_session_token=frozen.token,
    )
    c = sts.assume_role(RoleArn=role_arn, RoleSessionName="imgest-renewal")["Credentials"]
    creds = Credentials(c["AccessKeyId"], c["SecretAccessKey"], c["SessionToken"], method="assume-role")
    creds._expiry_time = c["Expiration"]  # type: ignore[attr-defined]  # read back by expiry_of
    return creds


def _renewer(settings: S3Settings):  # -> Callable[[], dict[str, str]]
    """botocore's refresh callback for shipped temporary keys: the connection's role assumed again with this host's
    own credentials (``role_arn``), else the profile they came from where this host has it (``profile``), else this
    host's own chain (its role, web identity), never the shipped keys themselves; a clear error when none gives new
    keys."""

    def renew() -> dict[str, str]:
        expired = datetime.fromtimestamp(settings.expires_at or 0, UTC).isoformat(timespec="seconds")
        own = _own_chain(settings.access_key, settings.profile, settings.region)
        try:
            if settings.role_arn and own is not None:
                own = _assume(settings.role_arn, own, settings)
        except Exception as exc:  # a role removed, or this host may no longer assume it
            raise ConfigError(
                f"the temporary S3 credentials shipped with this job expire at {expired} and role "
                f"{settings.role_arn} could not be assumed again to renew them: {exc}"
            ) from exc
        frozen = own.get_frozen_credentials() if own is not None else None
        if frozen is None or frozen.access_key == settings.access_key:
            raise ConfigError(
                f"the temporary S3 credentials shipped with this job expire at {expired} and this host has none of "
                "its own to renew them: give it a role (instance profile, IRSA / web identity, container "
                "credentials), set the connection's role_arn, or use credentials that outlive the job"
            )
        until = expiry_of(own) or time.time() + 3600.0
        log.info("S3 credentials renewed (%s), valid until %s", own.method, until)
        return {
            "access_key": frozen.access_key,
            "secret_key": frozen.secret_key,
            "token": frozen.token or "",
            "expiry_time": datetime.fromtimestamp(until, UTC).isoformat(),
        }

    return renew


def botocore_credentials(settings: S3Settings) -> Any:
    """What botocore signs with for SETTINGS (see the module's docstring); None when nothing is found."""
    from botocore.credentials import Credentials, RefreshableCredentials

    if not (settings.access_key and settings.secret_key):
        return _chain()
    if settings.expires_at is None:
        return Credentials(settings.access_key, settings.secret_key, settings.session_token)
    creds = RefreshableCredentials.create_from_metadata(
        metadata={
            "access_key": settings.access_key,
            "secret_key": settings.secret_key,
            "token": settings.session_token or "",
            "expiry_time": datetime.fromtimestamp(settings.expires_at, UTC).isoformat(),
        },
        refresh_using=_renewer(settings),
        method="imgest-shipped",
    )
    creds._advisory_refresh_timeout = RENEW_BEFORE_S  # botocore's defaults: 15 / 10 minutes before expiry
    creds._mandatory_refresh_timeout = min(RENEW_BEFORE_S, 300.0)
    return creds


def frozen_settings(settings: S3Settings) -> S3Settings:
    """SETTINGS with the chain's current keys, token and expiry when it has no keys (unchanged otherwise)."""
    if settings.access_key and settings.secret_key:
        return settings
    chain = _chain()
    if chain is None:
        where = settings.endpoint_url or f"AWS S3 ({settings.region})"
        raise ConfigError(
            f"no S3 credentials for {where}: set the connection's keys (aws_default / source_conn_id), "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile (AWS_PROFILE), or run with a role"
        )
    frozen = chain.get_frozen_credentials()
    import os

    return replace(
        settings,
        profile=settings.profile or os.environ.get("AWS_PROFILE") or None,  # where renewal resolves them again
        access_key=frozen.access_key,
        secret_key=frozen.secret_key,
        session_token=frozen.token or None,
        expires_at=expiry_of(chain),
    )


def s3_client(settings: S3Settings, max_pool_connections: int) -> Any:
    """A boto3 S3 client signing with ``botocore_credentials(SETTINGS)`` (renewed as they near expiry)."""
    import boto3
    import botocore.session
    from botocore.config import Config

    core = botocore.session.get_session()
    credentials = botocore_credentials(settings)
    if credentials is not None:
        core._credentials = credentials  # botocore's own slot: every client of the session signs with it
    return boto3.Session(botocore_session=core, region_name=settings.region).client(
        "s3",
        endpoint_url=settings.endpoint_url,
        config=Config(
            retries={"max_attempts": 5, "mode": "standard"},
            s3={"addressing_style": "path"},
            max_pool_connections=max_pool_connections,
        ),
    )


def env_of(settings: S3Settings, prefix: str = "") -> dict[str, str]:
    """SETTINGS' keys as the environment of a process imgest starts (spark-submit): PREFIX+AWS_ACCESS_KEY_ID,
    _SECRET_ACCESS_KEY, _SESSION_TOKEN and IMGEST_S3_CREDENTIALS_EXPIRY; {} without keys (the chain decides)."""
    if not (settings.access_key and settings.secret_key):
        return {}
    env = {f"{prefix}AWS_ACCESS_KEY_ID": settings.access_key, f"{prefix}AWS_SECRET_ACCESS_KEY": settings.secret_key}
    if settings.role_arn and not prefix:
        env["IMGEST_S3_ROLE_ARN"] = settings.role_arn
    if settings.profile and not prefix:
        env["IMGEST_S3_PROFILE"] = settings.profile
    if settings.session_token:
        env[f"{prefix}AWS_SESSION_TOKEN"] = settings.session_token
        if settings.expires_at is not None:
            env[f"{prefix}S3_CREDENTIALS_EXPIRY" if prefix else "IMGEST_S3_CREDENTIALS_EXPIRY"] = repr(
                settings.expires_at
            )
    return env
