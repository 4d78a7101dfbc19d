"""The bulk path's pure pieces: CQL value encoding, the replicas a consistency level needs, what the helper's
header carries (credentials and the CA on stdin, never in its command line)."""

from __future__ import annotations

import collections
import io
import os
import struct
import uuid
from pathlib import Path
from typing import Any

import pytest

from imgest.core.settings import CassandraSettings
from imgest.sinks.cassandra.bulk_helper import JVM_OPENS, MAIN_CLASS, BulkHelper, java_command, row_frame
from imgest.sinks.cassandra.bulk_writer import BulkTarget, encode
from imgest.sinks.cassandra.write_path import required


def test_values_encode_as_cql_stores_them() -> None:
    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert encode(u) == u.bytes
    assert encode(7) == b"\x00\x00\x00\x07"
    assert encode(-1) == b"\xff\xff\xff\xff"
    assert encode("n01440764/é") == "n01440764/é".encode()
    assert encode(b"\xff\xd8") == b"\xff\xd8"
    assert encode(None) is None
    with pytest.raises(TypeError):
        encode(True)


def test_row_frame_is_what_the_helper_reads() -> None:
    """'R', u8 table, u16 columns, then per column an i32 length (-1: null) and the bytes (BulkWriter.row)."""
    frame = row_frame(3, [b"ab", None, b""])
    assert frame == b"R" + struct.pack(">BH", 3, 3) + struct.pack(">i", 2) + b"ab" + struct.pack(">i", -1) + b"\0" * 4


def test_a_reply_skips_what_else_the_jvm_printed_on_stdout() -> None:
    """A JVM option's notice on stdout (JFR's start-up line, say) goes to the helper's log, not into the reply."""
    helper = object.__new__(BulkHelper)  # the reply reader alone, no JVM
    helper._stderr = io.BytesIO()  # type: ignore[assignment]
    out = io.BytesIO(b"[0.9s][info][jfr,startup] Started recording 1.\nOK 12 0.250\n")
    assert helper._reply(out) == "OK 12 0.250"
    assert helper._stderr.getvalue() == b"stdout: [0.9s][info][jfr,startup] Started recording 1.\n"
    assert helper._reply(io.BytesIO(b"noise\n")) == ""  # the helper exited without a reply


@pytest.mark.parametrize(
    ("level", "replicas", "need"),
    [("ONE", 3, 1), ("LOCAL_ONE", 3, 1), ("TWO", 3, 2), ("QUORUM", 3, 2), ("LOCAL_QUORUM", 5, 3), ("ALL", 3, 3)],
)
def test_replicas_needed(level: str, replicas: int, need: int) -> None:
    assert required(level, replicas) == need


def test_header_carries_credentials_and_ca_and_the_command_line_does_not(tmp_path: Path) -> None:
    ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    settings = CassandraSettings(
        hosts=("10.0.0.1", "10.0.0.2"), port=9142, username="loader", password="s3cret-zq", ssl_ca_data=ca
    )
    tables = (("data", "CREATE TABLE ks.data (id uuid PRIMARY KEY)", "INSERT INTO ks.data (id) VALUES (?)"),)
    target = BulkTarget(helper=str(tmp_path), keyspace="ks", partitioner="M3", tables=tables, storage_port=7001)
    header = target.header(settings)
    assert header["loader"] == {
        "hosts": ["10.0.0.1", "10.0.0.2"],
        "native_port": 9142,
        "storage_port": 7001,
        "connections_per_host": 1,
        "ignore": [],
        "user": "loader",
        "password": "s3cret-zq",
        "ca_pem": ca,
    }
    assert header["tables"] == [{"name": "data", "create": tables[0][1], "insert": tables[0][2]}]
    cmd = java_command(tmp_path)
    assert cmd[-1] == MAIN_CLASS
    assert set(JVM_OPENS) <= set(cmd)
    assert not any("s3cret" in part or "BEGIN CERTIFICATE" in part for part in cmd)


def test_cql_mode_header_carries_the_batches_the_level_and_the_retries(tmp_path: Path) -> None:
    settings = CassandraSettings(hosts=("10.0.0.1",), port=9042, username="w", password="pw-9", local_dc="dc2")
    batch = "BEGIN UNLOGGED BATCH INSERT INTO ks.data (id) VALUES (?); APPLY BATCH"
    target = BulkTarget(
        helper=str(tmp_path), keyspace="ks", partitioner="M3", tables=(("train", "", batch),), storage_port=0,
        mode="cql", consistency="QUORUM", max_in_flight=32, retries=4, backoff_s=0.5,
    )  # fmt: skip
    header = target.header(settings)
    assert {k: header[k] for k in ("mode", "consistency", "max_in_flight", "retries", "backoff_s")} == {
        "mode": "cql",
        "consistency": "QUORUM",
        "max_in_flight": 32,
        "retries": 4,
        "backoff_s": 0.5,
    }
    assert header["tables"] == [{"name": "train", "create": "", "insert": batch}]
    assert (header["max_in_flight_bytes"], header["timeout_s"]) == (256 << 20, 30.0)  # as the Python driver's writer
    assert (header["loader"]["user"], header["loader"]["password"], header["loader"]["local_dc"]) == (
        "w",
        "pw-9",
        "dc2",
    )


def test_a_cql_round_reply_names_the_refused_rows_and_the_resends() -> None:
    """CqlRows answers a round with a BAD line per row refused for good, then OK rows 0 resends."""
    helper = object.__new__(BulkHelper)  # the reply reader alone, no JVM
    helper._stderr = io.BytesIO()  # type: ignore[assignment]
    reply = b"BAD 3 too_large InvalidQueryException: Mutation of 40 MiB is too large\nBAD 7 error X: y z\nOK 9 0 2\n"
    helper._proc = type("P", (), {"stdout": io.BytesIO(reply)})()  # type: ignore[assignment]
    helper._loading = collections.deque([9])
    assert helper.wait_load() == 9
    assert helper.refused == [
        (3, "too_large", "InvalidQueryException: Mutation of 40 MiB is too large"),
        (7, "error", "X: y z"),
    ]
    assert helper.resent == 2


def test_scratch_of_a_gone_worker_is_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    import subprocess

    from imgest.sinks.cassandra.bulk_helper import SCRATCH_PREFIX, remove_stale_scratch

    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = tmp_path / f"{SCRATCH_PREFIX}{gone.pid}-abc"
    live = tmp_path / f"{SCRATCH_PREFIX}{os.getpid()}-def"
    other = tmp_path / f"{SCRATCH_PREFIX}xyz"  # not a pid-named folder: left alone
    for folder in (stale, live, other):
        (folder / "sstables").mkdir(parents=True)
        (folder / "helper.log").write_text("log")
    assert remove_stale_scratch(tmp_path) == 1
    assert not stale.exists()
    assert live.is_dir()
    assert other.is_dir()


def test_cql_helper_asked_for_without_java_or_an_installed_helper_names_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from imgest.core.errors import ConfigError
    from imgest.sinks.cassandra import write_path
    from imgest.sinks.cassandra.bulk_helper import BulkLoadError

    monkeypatch.setattr(write_path, "installed", lambda: tmp_path)
    monkeypatch.setattr(write_path, "tool", lambda name, hint: f"/usr/bin/{name}")
    assert write_path.choose(None, "cql-helper", 10).path == "cql-helper"  # java and the helper: no javac, no mvn

    def no_java(name: str, hint: str) -> str:
        raise BulkLoadError(f"bulk-load helper: no {name} on PATH; install a Java 17 runtime")

    monkeypatch.setattr(write_path, "tool", no_java)
    with pytest.raises(ConfigError, match="--write-path cql-helper: no java on PATH; use --write-path cql"):
        write_path.choose(None, "cql-helper", 10)
    monkeypatch.setattr(write_path, "installed", lambda: None)
    with pytest.raises(ConfigError, match=r"the bulk-load helper is not installed here \(imgest bulk-helper install\)"):
        write_path.choose(None, "cql-helper", 10)


class _Cluster:
    """system.local and system.peers of a cluster whose nodes run RELEASE."""

    def __init__(self, release: str) -> None:
        self.release = release

    def execute(self, query: str) -> list[Any]:
        row = type("Row", (), {"release_version": self.release})()
        return [row] if "system.local" in query else []


@pytest.mark.parametrize(
    ("release", "rows", "path"),
    [("5.0.9", 20_000, "bulk"), ("5.0.9", 19_999, "cql"), ("4.1.7", 20_000, "cql-helper"), ("4.1.7", 500, "cql")],
)
def test_auto_picks_bulk_on_cassandra_5_and_the_helpers_cql_elsewhere(
    release: str, rows: int, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from imgest.sinks.cassandra import write_path

    monkeypatch.setattr(write_path, "tool", lambda name, hint: f"/usr/bin/{name}")  # a machine with Java
    monkeypatch.setattr(write_path, "installed", lambda: Path("/opt/helper"))  # and the helper installed

    chosen = write_path.choose(_Cluster(release), "auto", rows)
    assert chosen.path == path, chosen.reason
    assert chosen.reason.startswith("auto: ")


def test_auto_without_the_helper_installed_picks_cql_saying_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from imgest.sinks.cassandra import write_path

    monkeypatch.setattr(write_path, "tool", lambda name, hint: f"/usr/bin/{name}")
    monkeypatch.setattr(write_path, "installed", lambda: None)
    chosen = write_path.choose(_Cluster("5.0.9"), "auto", 50_000)
    assert chosen == write_path.WritePath(
        "cql", "auto: the bulk-load helper is not installed here (imgest bulk-helper install)"
    )


def test_what_is_still_to_come_scales_by_the_stored_to_source_ratio() -> None:
    """Ahead: the source bytes after each chunk, scaled by what the chunks before stored of theirs."""
    from imgest.sinks.cassandra.ingest import Ahead
    from imgest.sources.manifest import Candidate

    def chunk(*sizes: int) -> list[Candidate]:
        return [Candidate(f"id{i}", "train", f"n/{i}", "n", 0, s, 0.0) for i, s in enumerate(sizes)]

    ahead = Ahead(1000)
    assert ahead.after(chunk(100, 100)) == 800  # nothing stored yet: as an unchanged copy
    ahead.stored = 50  # the first chunk stored a quarter of its source bytes (re-encoded smaller)
    assert ahead.after(chunk(200)) == 150  # 600 source bytes left, at 50 / 200
    assert Ahead(None).after(chunk(100)) is None  # unknown: rounds by size only
    assert Ahead(10).after(chunk(100)) == 0


def test_a_lazy_session_connects_on_first_use_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The helper paths' workers of a new version connect to Cassandra only to record a quarantined image."""
    from imgest.sinks.cassandra import ingest

    connects: list[CassandraSettings] = []

    class Session:
        def execute(self, *args: object) -> str:
            return "done"

    monkeypatch.setattr(ingest, "shared_session", lambda settings: connects.append(settings) or Session())
    lazy = ingest.LazySession(CassandraSettings(hosts=("10.0.0.9",)))
    assert connects == []  # made, never used: no connection
    assert lazy.execute("INSERT ...") == "done"
    assert lazy.execute("INSERT ...") == "done"
    assert len(connects) == 1
