"""Temporary keys resolved for real, not built by hand: a shared-config profile whose ``credential_process`` prints
new keys and their Expiration on each call (as ``aws configure export-credentials``, granted, or an SSO helper do).
What a job ships carries that very expiry, read back from botocore's resolved credentials (if reading it ever gave
None, renewal would be off without a word), and keys near it are renewed by running the process again."""

from __future__ import annotations

import sys
import textwrap
from datetime import datetime
from pathlib import Path

import pytest

from imgest.core.credentials import RENEW_BEFORE_S, frozen_settings
from imgest.core.settings import S3Settings

PROCESS = textwrap.dedent(
    """
    import json, sys
    from datetime import UTC, datetime, timedelta
    from pathlib import Path

    calls, ahead = Path(sys.argv[1]), float(sys.argv[2])
    n = len(calls.read_text().splitlines()) + 1 if calls.exists() else 1
    expires = (datetime.now(UTC) + timedelta(seconds=ahead)).replace(microsecond=0).isoformat()
    with calls.open("a") as fh:
        fh.write(expires + "\\n")
    keys = {"AccessKeyId": f"ASIAPROCESS{n:05d}", "SecretAccessKey": f"secret-{n}", "SessionToken": f"token-{n}"}
    print(json.dumps({"Version": 1, **keys, "Expiration": expires}))
    """
)


@pytest.fixture
def profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Profile 'proc' (AWS_PROFILE) whose process logs each call's Expiration to the returned file; its keys are
    valid for the seconds in the file 'ahead' beside it (written by each test)."""
    script, calls = tmp_path / "process.py", tmp_path / "calls.txt"
    script.write_text(PROCESS.replace("float(sys.argv[2])", "float(Path(sys.argv[2]).read_text())"))
    (tmp_path / "config").write_text(
        f"[profile proc]\ncredential_process = {sys.executable} {script} {calls} {tmp_path / 'ahead'}\n"
    )
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ROLE_ARN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("IMGEST_S3_CREDENTIALS_EXPIRY", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_PROFILE", "proc")
    return calls


def _expiries(calls: Path) -> list[float]:
    return [datetime.fromisoformat(line).timestamp() for line in calls.read_text().splitlines()]


def test_what_a_job_ships_carries_the_resolved_keys_expiry(profile: Path) -> None:
    (profile.parent / "ahead").write_text("7200")
    shipped = frozen_settings(S3Settings(endpoint_url="http://127.0.0.1:9"))
    assert (shipped.access_key, shipped.secret_key, shipped.session_token) == (
        "ASIAPROCESS00001",
        "secret-1",
        "token-1",
    )
    assert shipped.expires_at == _expiries(profile)[0]  # the process's Expiration, to the second
    assert shipped.profile == "proc"  # where a host renews them from


def test_keys_near_their_expiry_are_renewed_by_running_the_process_again(profile: Path) -> None:
    (profile.parent / "ahead").write_text(str(RENEW_BEFORE_S / 2))  # already inside the renewal window
    shipped = frozen_settings(S3Settings(endpoint_url="http://127.0.0.1:9"))
    assert shipped.expires_at == _expiries(profile)[0]
    (profile.parent / "ahead").write_text("7200")
    creds = shipped.credentials()
    renewed = creds.get_frozen_credentials()
    assert len(_expiries(profile)) >= 2  # the process ran again
    assert (renewed.access_key, renewed.token) != (shipped.access_key, shipped.session_token)
    assert renewed.access_key.startswith("ASIAPROCESS")
    assert creds._expiry_time.timestamp() == _expiries(profile)[-1]  # the new keys' own expiry, renewed from it on
