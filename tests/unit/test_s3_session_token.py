"""Temporary keys carry their session token to every S3 client imgest builds outside boto3: Arrow's filesystem (the
staged work files executors read) and the environment DALI's AWS SDK reads; and a stager ships keys, never a chain
the executors do not have."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from imgest.core.settings import S3Settings
from imgest.core.staging import Stager, _filesystem
from imgest.readback.dali_s3 import dali_s3_env

TEMPORARY = S3Settings(
    endpoint_url="http://127.0.0.1:1",
    access_key="ASIAEXAMPLE",
    secret_key="secret",
    session_token="the-session-token",
    region="eu-west-1",
)


def _arrow_args(fs: object) -> dict:
    return fs.__reduce__()[1][0]  # type: ignore[attr-defined,index]  # the constructor's arguments, as pickled


def test_arrow_signs_with_the_session_token() -> None:
    args = _arrow_args(_filesystem(TEMPORARY))
    assert (args["access_key"], args["secret_key"]) == ("ASIAEXAMPLE", "secret")
    assert args["session_token"] == "the-session-token"
    assert args["region"] == "eu-west-1"
    assert (args["scheme"], args["endpoint_override"]) == ("http", "127.0.0.1:1")


def test_arrow_takes_temporary_keys_that_are_still_valid_as_they_are() -> None:
    fresh = S3Settings(**{**TEMPORARY.__dict__, "expires_at": time.time() + 3600})
    assert _arrow_args(_filesystem(fresh))["session_token"] == "the-session-token"


def test_static_keys_send_no_token() -> None:
    static = S3Settings(endpoint_url="http://h:1", access_key="AKIA", secret_key="s")
    assert _arrow_args(_filesystem(static))["session_token"] == ""


def test_dali_gets_the_token_and_no_stale_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SESSION_TOKEN", "a token of another identity")
    with dali_s3_env(TEMPORARY):
        assert os.environ["AWS_ACCESS_KEY_ID"] == "ASIAEXAMPLE"
        assert os.environ["AWS_SESSION_TOKEN"] == "the-session-token"
    assert os.environ["AWS_SESSION_TOKEN"] == "a token of another identity"
    static = S3Settings(endpoint_url="http://h:1", access_key="AKIA", secret_key="s")
    with dali_s3_env(static):
        assert "AWS_SESSION_TOKEN" not in os.environ  # static keys signed with another identity's token fail
    assert os.environ["AWS_SESSION_TOKEN"] == "a token of another identity"


def test_a_stager_ships_the_chains_keys(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A driver without keys in its settings (a profile here; SSO or a role alike) stages with the keys its chain
    resolved, session token included, so executors on other hosts need no chain of their own."""
    config = tmp_path / "credentials"
    config.write_text(
        "[p]\naws_access_key_id = AKIAPROFILE\naws_secret_access_key = psecret\naws_session_token = ptok\n"
    )
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "IMGEST_S3_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(config))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config) + ".none")
    monkeypatch.setenv("AWS_PROFILE", "p")
    stager = Stager("ds", "s3://bucket/state", S3Settings(endpoint_url="http://h:1"))
    assert stager.s3 is not None
    assert (stager.s3.access_key, stager.s3.secret_key, stager.s3.session_token) == ("AKIAPROFILE", "psecret", "ptok")


def test_the_role_travels_to_spark_submit_for_renewal(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's driver learns the connection's role through its environment (an ARN, not a secret), to assume it
    again when the shipped keys near expiry."""
    from imgest.core.credentials import env_of

    arn = "arn:aws:iam::123456789012:role/ingest"
    env = env_of(S3Settings(**{**TEMPORARY.__dict__, "expires_at": 1.0e9, "role_arn": arn}))
    assert env["IMGEST_S3_ROLE_ARN"] == arn
    assert env["AWS_SESSION_TOKEN"] == "the-session-token"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert S3Settings.from_env().role_arn == arn
