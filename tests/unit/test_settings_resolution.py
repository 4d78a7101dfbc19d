"""Settings resolve in one order (flag, then connection or IMGEST_* variable, then the embedded services only when
their variables are set) and never fall back to 127.0.0.1; S3 credentials follow botocore's chain and carry their
session token, and shipped temporary keys are renewed from the host's own chain before they expire."""

from __future__ import annotations

import argparse
import pickle
import time
from pathlib import Path

import pytest

from imgest.cli.common import add_cassandra_args, cassandra_settings
from imgest.core.credentials import env_of
from imgest.core.errors import ConfigError
from imgest.core.settings import CassandraSettings, S3Settings
from imgest.services.embedded import embedded_env

STORE_VARS = (
    "IMGEST_CASSANDRA_HOSTS",
    "IMGEST_CASSANDRA_PORT",
    "IMGEST_S3_ENDPOINT",
    "IMGEST_S3_CREDENTIALS_FILE",
    "IMGEST_S3_CREDENTIALS_EXPIRY",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
)


@pytest.fixture
def bare_host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """An environment that names no store and where botocore's chain finds nothing (no files, no metadata)."""
    for name in STORE_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return monkeypatch


def _cli_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_cassandra_args(p)
    return p.parse_args(list(argv))


def test_no_cassandra_setting_is_an_error_naming_it(bare_host: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"--hosts, set IMGEST_CASSANDRA_HOSTS"):
        CassandraSettings.from_env()
    with pytest.raises(ConfigError, match="IMGEST_CASSANDRA_HOSTS"):
        cassandra_settings(_cli_args())


def test_cli_takes_the_variable_and_the_flag_wins(bare_host: pytest.MonkeyPatch) -> None:
    bare_host.setenv("IMGEST_CASSANDRA_HOSTS", "10.20.0.5, 10.20.0.6")
    bare_host.setenv("IMGEST_CASSANDRA_PORT", "19042")
    from_env = cassandra_settings(_cli_args())
    assert (from_env.hosts, from_env.port) == (("10.20.0.5", "10.20.0.6"), 19042)
    flagged = cassandra_settings(_cli_args("--hosts", "10.30.0.1", "--port", "9043"))
    assert (flagged.hosts, flagged.port) == (("10.30.0.1",), 9043)


def test_s3_without_endpoint_is_aws_and_aws_variables_count(bare_host: pytest.MonkeyPatch) -> None:
    assert S3Settings.from_env().endpoint_url is None  # AWS S3 itself, never http://127.0.0.1:8333
    assert S3Settings().endpoint_url is None
    bare_host.setenv("AWS_ENDPOINT_URL", "https://objects.example:9000")
    assert S3Settings.from_env().endpoint_url == "https://objects.example:9000"
    bare_host.setenv("AWS_ENDPOINT_URL_S3", "https://s3.example")
    assert S3Settings.from_env().endpoint_url == "https://s3.example"
    bare_host.setenv("IMGEST_S3_ENDPOINT", "http://10.20.0.5:8333")
    assert S3Settings.from_env().endpoint_url == "http://10.20.0.5:8333"


def test_embedded_settings_only_through_their_variables(bare_host: pytest.MonkeyPatch) -> None:
    settings = S3Settings.from_env()
    assert settings.access_key is None  # no keys file read by itself
    assert settings.credentials() is None
    for key, value in embedded_env().items():
        bare_host.setenv(key, value)
    assert CassandraSettings.from_env().hosts == ("127.0.0.1",)
    assert S3Settings.from_env().endpoint_url == embedded_env()["IMGEST_S3_ENDPOINT"]


def test_session_token_is_signed_with_and_never_shown(bare_host: pytest.MonkeyPatch) -> None:
    bare_host.setenv("AWS_ACCESS_KEY_ID", "ASIAEXAMPLE")
    bare_host.setenv("AWS_SECRET_ACCESS_KEY", "secret-example")
    bare_host.setenv("AWS_SESSION_TOKEN", "token-example")
    settings = S3Settings.from_env()
    assert settings.session_token == "token-example"
    assert settings.credentials().get_frozen_credentials().token == "token-example"
    client = settings.client()
    assert client._request_signer._credentials.get_frozen_credentials().token == "token-example"
    assert "token-example" not in repr(settings)
    assert "secret-example" not in repr(settings)
    assert env_of(settings)["AWS_SESSION_TOKEN"] == "token-example"
    assert pickle.loads(pickle.dumps(settings)) == settings  # travels inside Spark tasks


def test_botocore_chain_when_no_keys_are_given(bare_host: pytest.MonkeyPatch, tmp_path: Path) -> None:
    profiles = tmp_path / "credentials"
    profiles.write_text("[train]\naws_access_key_id = AKIAPROFILE\naws_secret_access_key = from-profile\n")
    bare_host.setenv("AWS_SHARED_CREDENTIALS_FILE", str(profiles))
    bare_host.setenv("AWS_PROFILE", "train")
    settings = S3Settings.from_env()
    assert settings.access_key is None
    assert settings.credentials().get_frozen_credentials().access_key == "AKIAPROFILE"
    frozen = settings.frozen()  # what a driver ships to executors that have no profile
    assert (frozen.access_key, frozen.secret_key) == ("AKIAPROFILE", "from-profile")


def test_frozen_without_any_credentials_names_what_to_set(bare_host: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"no S3 credentials for AWS S3 .*AWS_ACCESS_KEY_ID"):
        S3Settings.from_env().frozen()


def test_shipped_keys_near_expiry_renew_from_the_hosts_chain(bare_host: pytest.MonkeyPatch) -> None:
    shipped = S3Settings(access_key="ASIAOLD", secret_key="old", session_token="t-old", expires_at=time.time() + 60)
    bare_host.setenv("AWS_ACCESS_KEY_ID", "AKIAHOSTROLE")
    bare_host.setenv("AWS_SECRET_ACCESS_KEY", "host-secret")
    renewed = shipped.credentials().get_frozen_credentials()
    assert (renewed.access_key, renewed.secret_key) == ("AKIAHOSTROLE", "host-secret")
    fresh = S3Settings(access_key="ASIAOK", secret_key="ok", session_token="t", expires_at=time.time() + 7200)
    assert fresh.credentials().get_frozen_credentials().access_key == "ASIAOK"  # far from expiry: kept


def test_shipped_keys_that_expire_on_a_host_without_a_role_fail_clearly(bare_host: pytest.MonkeyPatch) -> None:
    shipped = S3Settings(access_key="ASIAOLD", secret_key="old", session_token="t-old", expires_at=time.time() + 30)
    with pytest.raises(ConfigError, match=r"expire at .* and this host has none of its own"):
        shipped.credentials().get_frozen_credentials()


def test_no_credentials_anywhere_is_a_clear_error_before_any_request(bare_host: pytest.MonkeyPatch) -> None:
    from imgest.sinks.shards.s3_client import S3AuthError, check_access

    with pytest.raises(S3AuthError, match=r"no credentials found: .*AWS_PROFILE.*IMGEST_S3_ENDPOINT"):
        check_access(S3Settings(), "datasets")
