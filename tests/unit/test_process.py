"""Service start-up failures, produced for real: busy ports, missing programs, a process that dies."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest

from imgest.core.errors import ServiceError
from imgest.services.cassandra import CassandraServer, resolve_jars
from imgest.services.process import ManagedProcess, last_error_line, stop_all


@pytest.fixture
def busy_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_port_already_taken_is_one_line_error(tmp_path: Path, busy_port: int) -> None:
    server = CassandraServer(home=tmp_path / "c", native_port=busy_port, storage_port=busy_port)
    with pytest.raises(ServiceError) as err:
        server.up()
    message = str(err.value)
    assert f"127.0.0.1:{busy_port} is already taken" in message
    assert "IMGEST_CASSANDRA_PORT" in message
    assert "\n" not in message


def test_missing_java_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    server = CassandraServer(home=tmp_path / "c", native_port=1, storage_port=1)
    with pytest.raises(ServiceError, match="'java' not found on PATH"):
        server.up()


def test_missing_maven_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServiceError, match="'mvn' not found on PATH"):
        resolve_jars(tmp_path / "lib")


def test_process_dying_during_start_names_cause_and_log(tmp_path: Path) -> None:
    proc = ManagedProcess("fake", tmp_path / "fake.pid", tmp_path / "fake.log")
    proc.start(
        [
            sys.executable,
            "-c",
            "print('INFO starting'); print('ERROR bind failed: port 1'); raise SystemExit(3)",
        ]
    )
    with pytest.raises(ServiceError) as err:
        proc.wait_ready(lambda: False, timeout=20, what="nothing")
    message = str(err.value)
    assert "fake exited during start: ERROR bind failed: port 1" in message
    assert str(tmp_path / "fake.log") in message
    assert proc.pid() is None
    assert not (tmp_path / "fake.pid").exists()


def test_stop_kills_what_was_started(tmp_path: Path) -> None:
    proc = ManagedProcess("sleeper", tmp_path / "s.pid", tmp_path / "s.log")
    pid = proc.start([sys.executable, "-c", "import time; time.sleep(60)"])
    assert proc.pid() == pid
    assert proc.stop(timeout=5)
    assert proc.pid() is None
    assert not proc.stop()


def test_last_error_line_prefers_errors(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("INFO a\nERROR [main] Exception encountered during startup: bad yaml key\nINFO shutdown\n")
    assert last_error_line(log).endswith("bad yaml key")
    assert last_error_line(tmp_path / "missing.log") == "no log was written"


def test_rendered_cassandra_config_sets_ports_auth_and_blob_limits(tmp_path: Path) -> None:
    server = CassandraServer(home=tmp_path, native_port=9999, storage_port=7999, auth=True)
    text = server.render_config().read_text()
    assert "native_transport_port: 9999" in text
    assert 'seeds: "127.0.0.1:7999"' in text
    assert "authenticator: PasswordAuthenticator" in text
    # a 16 MB blob needs commitlog segments of at least 32 MiB and a message limit above it
    assert "commitlog_segment_size: 64MiB" in text
    assert "native_transport_max_message_size: 64MiB" in text
    assert "${" not in text


def test_stop_all_stops_together_and_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    polite = ManagedProcess("polite", tmp_path / "a.pid", tmp_path / "a.log")
    stubborn = ManagedProcess("stubborn", tmp_path / "b.pid", tmp_path / "b.log")
    absent = ManagedProcess("absent", tmp_path / "c.pid", tmp_path / "c.log")
    polite.start([sys.executable, "-c", "import time; time.sleep(60)"])
    ignore = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    )
    stubborn.start([sys.executable, "-c", ignore])
    deadline = time.monotonic() + 10
    while "ready" not in stubborn.log_file.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stop_all([polite, stubborn, absent], timeout=1) == [True, True, False]
    assert polite.pid() is None
    assert stubborn.pid() is None
    assert not polite.pid_file.exists()
    assert not stubborn.pid_file.exists()
