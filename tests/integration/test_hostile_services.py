"""Against the real services: refused credentials fail before any Spark work with one clear line (CLI) and
without retries (DAG steps); the embedded Airflow home keeps its secrets encrypted and private."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from imgest.core.errors import AuthenticationError
from imgest.core.settings import CassandraSettings, S3Settings
from imgest.services import AirflowServer, CassandraServer, S3Server

pytestmark = [pytest.mark.services]
IMGEST = str(Path(sys.executable).parent / "imgest")


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "n01").mkdir(parents=True)
    Image.new("RGB", (40, 30)).save(src / "n01" / "a.JPEG")
    return src


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([IMGEST, *argv], capture_output=True, text=True, env={**os.environ, **env}, check=False)


def test_wrong_cassandra_password_is_one_line_before_spark(
    cassandra_auth_server: CassandraServer, source: Path, tmp_path: Path
) -> None:
    (tmp_path / "pw").write_text("wrong-pw-zz9\n")  # the CLI's --password-file (the Spark jobs get it by environment)
    env = {"IMGEST_CASSANDRA_USER": "", "IMGEST_CASSANDRA_PASSWORD": ""}
    argv = ["ingest", "cassandra", str(source), "--port", str(cassandra_auth_server.native_port)]
    argv += ["--user", "cassandra", "--password-file", str(tmp_path / "pw")]
    done = _run([*argv, "--keyspace", "hostile", "--work-dir", str(tmp_path / "w")], env)
    first = done.stderr.splitlines()[0]
    assert done.returncode == 1
    assert first.startswith("imgest: error: Cassandra at 127.0.0.1:")
    assert "refused the credentials of user 'cassandra'" in first
    assert "Traceback" not in done.stderr
    assert "wrong-pw-zz9" not in done.stdout + done.stderr
    assert not (tmp_path / "w").exists()  # neither scanned nor submitted


def test_wrong_s3_keys_are_one_line_before_spark(s3_server: S3Server, source: Path, tmp_path: Path) -> None:
    key, _ = s3_server.credentials()
    env = {
        "AWS_ACCESS_KEY_ID": key,
        "AWS_SECRET_ACCESS_KEY": "wrong-secret-zz9",
        "IMGEST_S3_ENDPOINT": s3_server.endpoint,
    }
    dest = f"s3://{s3_server.bucket}/tests/hostile-denied"
    done = _run(["ingest", "shards", str(source), "--dest", dest, "--work-dir", str(tmp_path / "w")], env)
    first = done.stderr.splitlines()[0]
    assert done.returncode == 1
    assert first.startswith("imgest: error: checking s3://imgest/tests/hostile-denied: S3 at ")
    assert f"access key id {key!r}) refused the credentials" in first
    assert "wrong-secret-zz9" not in done.stdout + done.stderr
    assert not (tmp_path / "w").exists()


def test_dag_prepare_steps_fail_without_retries_on_refused_credentials(
    cassandra_auth_server: CassandraServer, s3_server: S3Server, tmp_path: Path
) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from imgest.flow.steps import prepare_bucket, prepare_cassandra
    from imgest.operators.failures import fail_without_retry

    bad_cassandra = CassandraSettings(
        hosts=(cassandra_auth_server.host,), port=cassandra_auth_server.native_port, username="cassandra", password="no"
    )
    with pytest.raises(AuthenticationError):
        prepare_cassandra({"sample": True, "keyspace": "hostile"}, tmp_path, bad_cassandra)
    with pytest.raises(AirflowFailException, match="refused the credentials"), fail_without_retry():
        prepare_cassandra({"sample": True, "keyspace": "hostile"}, tmp_path, bad_cassandra)
    key, _ = s3_server.credentials()
    bad_s3 = S3Settings(endpoint_url=s3_server.endpoint, access_key=key, secret_key="no-zz9", bucket="imgest")
    with pytest.raises(AirflowFailException, match="refused the credentials") as exc, fail_without_retry():
        prepare_bucket("s3://imgest/tests/hostile", bad_s3)
    assert "no-zz9" not in str(exc.value)


def test_airflow_home_keeps_secrets_encrypted_and_private(airflow_home: AirflowServer) -> None:
    home = airflow_home.home
    assert home.stat().st_mode & 0o777 == 0o700
    assert home.parent.stat().st_mode & 0o777 == 0o700  # the state folder
    for name in ("airflow.db", "airflow.cfg", "secrets.json"):
        assert (home / name).stat().st_mode & 0o777 == 0o600, name
    assert "fernet_key = " in (home / "airflow.cfg").read_text()
    with sqlite3.connect(home / "airflow.db") as db:
        rows = dict(db.execute("SELECT conn_id, is_encrypted FROM connection").fetchall())
        raw = db.execute("SELECT password FROM connection WHERE conn_id = 'aws_default'").fetchone()[0]
    assert rows["aws_default"] == 1
    _, secret = S3Server.default().credentials()
    assert secret not in raw
