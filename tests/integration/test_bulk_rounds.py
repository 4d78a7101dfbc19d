"""The bulk writer's rounds against the real node: a row counts as written only once the helper acknowledged the
round that holds it (one round in flight while the next is written), image bytes survive the reuse of the helper's
off-heap slabs across rounds, and a helper that fails or dies never gets a round counted."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from imgest.core import defaults, jvmcds
from imgest.core.quarantine import QuarantineLog
from imgest.core.settings import CassandraSettings
from imgest.services.cassandra import CassandraServer
from imgest.sinks.cassandra import bulk_helper, helper_cds
from imgest.sinks.cassandra.bulk_writer import BulkImageWriter
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sinks.cassandra.schema import TableLayout, apply_schema
from imgest.sinks.cassandra.write_path import bulk_target
from imgest.sinks.cassandra.writer import Row

pytestmark = pytest.mark.services
KS = "imgest_test_bulk_rounds"
ROW_BYTES, ROUND_BYTES = 30_000, 100_000  # four rows a round


@pytest.fixture(scope="module")
def target(cassandra_server: CassandraServer) -> Iterator[tuple[Any, CassandraSettings, Any]]:
    settings = CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)
    layout = TableLayout(keyspace=KS)
    with cassandra_session(settings) as session:
        session.execute(f"DROP KEYSPACE IF EXISTS {KS}", timeout=120)
        apply_schema(session, layout, ["train"], "SimpleStrategy:1")
        bulk = bulk_target(session, layout, ["train"], "ONE", None)
        yield dataclasses.replace(bulk, round_bytes=ROUND_BYTES), settings, session
        session.execute(f"DROP KEYSPACE IF EXISTS {KS}", timeout=120)
    bulk_helper._close_all()


@pytest.fixture(autouse=True)
def _empty_tables(target: tuple[Any, Any, Any]) -> None:
    """Each test starts from empty tables: what a test reads back is what it wrote, whatever ran before it."""
    for table in ("data", "metadata"):
        target[2].execute(f"TRUNCATE {KS}.{table}", timeout=120)


def _digest(data: bytes) -> str:
    """A row's bytes as their sha256 (a failing comparison of 100 rows of 30 KB each took pytest minutes to print)."""
    return hashlib.sha256(data).hexdigest()


def _row(i: int) -> Row:
    data = hashlib.sha256(str(i).encode()).digest() * (ROW_BYTES // 32)
    rid = uuid.uuid5(uuid.NAMESPACE_URL, f"bulk-rounds/{i}")
    meta = (rid, i % 3, "n0", "train", f"n0/{i}.JPEG", 1, 1, len(data), "s", "s", "k", "rounds", "v1")
    return Row(rid, i % 3, data, "train", meta, f"n0/{i}.JPEG")


def _writer(target: tuple[Any, Any, Any], written: list[str]) -> BulkImageWriter:
    bulk, settings, _session = target
    names = lambda split: ("data", "metadata")  # noqa: E731
    return BulkImageWriter(bulk, settings, names, QuarantineLog(), on_written=lambda r, n: written.append(r.rel_path))


def test_rows_count_once_their_round_is_acknowledged_and_survive_slab_reuse(target: tuple[Any, Any, Any]) -> None:
    session = target[2]
    written: list[str] = []
    in_flight: list[int] = []
    with _writer(target, written) as w:
        for i in range(30):
            w.write(_row(i))
            in_flight.append(w._helper.loading)
            # never more than two rounds in the helper's hands (one closing while one streams), and none of their rows
            # (nor those of the round being written) counts yet
            assert w._helper.loading <= 2
            assert len(written) == w.stats.written <= i + 1 - len(w._pending) - sum(map(len, w._loading))
    assert 2 in in_flight  # rows were written while two rounds were loading
    assert sorted(written) == sorted(f"n0/{i}.JPEG" for i in range(30))  # each once, after its round's ack
    assert w.stats.bytes == 30 * len(_row(0).data)
    stored = {r.id: _digest(r.data) for r in session.execute(f"SELECT id, data FROM {KS}.data")}
    assert stored == {_row(i).id: _digest(_row(i).data) for i in range(30)}
    paths = {r.rel_path for r in session.execute(f"SELECT rel_path FROM {KS}.metadata")}
    assert paths == set(written)
    # the helper streamed by the ring the driver read (no driver session of its own): 16 vnode ranges, 2 tables
    log = (w._helper.scratch / "helper.log").read_text()
    assert "the ring from the header: 16 ranges, 2 tables" in log
    assert "Skip fsync enabled due to property true" in log  # its scratch SSTables are never synced to its disk


def test_rounds_halve_towards_the_partitions_end(target: tuple[Any, Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Told what is still to come (expect), a round also ends once it holds as much as that: the last round, which
    streams with nothing left to overlap, is one row here instead of what a full round's remainder would be."""
    size = len(_row(0).data)
    monkeypatch.setattr(defaults, "BULK_MIN_ROUND_BYTES", size)
    bulk, settings, session = target
    big = (dataclasses.replace(bulk, round_bytes=10 * size), settings, session)
    written: list[str] = []
    rounds: list[int] = []
    with _writer(big, written) as w:
        start_load = w._helper.start_load
        monkeypatch.setattr(w._helper, "start_load", lambda: (rounds.append(w._helper.sent // 2), start_load()))
        for i in range(500, 520):
            w.expect((519 - i) * size)  # the bytes of the rows after this one
            w.write(_row(i))
    assert rounds == [10, 5, 3, 1, 1]  # rows per round (two helper rows each)
    assert sorted(written) == sorted(f"n0/{i}.JPEG" for i in range(500, 520))
    ids = [_row(i).id for i in range(500, 520)]
    select = session.prepare(f"SELECT id, data FROM {KS}.data WHERE id IN ?")
    stored = {r.id: _digest(r.data) for r in session.execute(select, [ids])}
    assert stored == {_row(i).id: _digest(_row(i).data) for i in range(500, 520)}


def test_rows_of_a_killed_helpers_round_never_count(target: tuple[Any, Any, Any]) -> None:
    """The helper dies while a round streams (killed, as an executor's OOM killer would): the writer raises on the
    next acknowledgement, the rows of the round that was not acknowledged never count, and a new writer starts a
    fresh helper."""
    written: list[str] = []
    acknowledged = -1
    with pytest.raises(bulk_helper.BulkLoadError, match="bulk-load helper"), _writer(target, written) as w:  # noqa: PT012
        for i in range(100, 108):  # two rounds: the first starts streaming after the fourth row
            w.write(_row(i))
            if w._helper.loading and acknowledged < 0:
                acknowledged = len(written)
                w._helper._proc.kill()
                w._helper._proc.wait()
    assert acknowledged == 0
    assert written == []
    with _writer(target, written) as w:
        w.write(_row(200))
    assert written[-1] == "n0/200.JPEG"


def test_the_built_helper_maps_its_class_data_archive_and_a_shipped_copy_runs_without(
    target: tuple[Any, Any, Any], tmp_path: Path
) -> None:
    """The build's training run left an archive; a helper JVM of the built folder maps it (-Xshare:on fails to start
    otherwise), and a copy elsewhere (Spark unpacks the shipped helper in its own folder) gets no archive flags."""
    home = Path(target[0].helper)
    flags, dump = bulk_helper.cds_options(home)
    assert dump is None
    assert flags[0].startswith("-XX:SharedArchiveFile=")
    assert Path(flags[0].split("=", 1)[1]).is_file()
    cmd = bulk_helper.java_command(home)
    cmd[1:1] = [*flags, "-Xshare:on"]
    run = subprocess.run(cmd, input=b"", capture_output=True, check=False)  # no header: it answers ERROR, exit 1
    assert run.stdout.startswith(b"ERROR EOFException"), run.stderr[-2000:]
    copy = tmp_path / home.name
    shutil.copytree(home, copy)
    assert bulk_helper.cds_options(copy) == ([], None)
    run = subprocess.run(bulk_helper.java_command(copy), input=b"", capture_output=True, check=False)
    assert run.stdout.startswith(b"ERROR EOFException"), run.stderr[-2000:]  # it starts, without an archive


def _no_live_writer(archive: Path, limit_s: float = 120.0) -> None:
    """Wait until no running JVM (another test's helper, on the other xdist worker) writes ARCHIVE."""
    deadline = time.monotonic() + limit_s
    while jvmcds.live_writer(archive):
        if time.monotonic() > deadline:
            pytest.fail(f"a JVM still writes {archive} after {limit_s:.0f} s (its .pid markers beside it)")
        time.sleep(0.2)


def test_the_first_load_on_the_host_dumps_an_archive_that_later_loads_map(target: tuple[Any, Any, Any]) -> None:
    """The training's archive lacks what a load reads from the jars (Cassandra's streaming): the first helper that
    loads dumps an archive of its own when it exits, which holds the streaming classes, and later loads map it
    (-Xshare:on starts). While another JVM writes it, a helper maps the training's archive instead."""
    home = Path(target[0].helper)
    full = jvmcds.archive_path(helper_cds.run_archive_name(home, "load"), home / "lib")
    trained = jvmcds.archive_path(helper_cds.archive_name(home), home / "lib")
    bulk_helper._close_all()
    _no_live_writer(full)
    jvmcds.adopt(full)  # a dump whose writer exited is moved into place first,
    full.unlink(missing_ok=True)  # and removed with any earlier load's: this test's writes it again
    written: list[str] = []
    with _writer(target, written) as w:
        for i in range(6):
            w.write(_row(1000 + i))
        args = [str(a) for a in w._helper._proc.args]  # type: ignore[union-attr]
    assert len(written) == 6
    dumping = [a for a in args if a.startswith("-XX:ArchiveClassesAtExit=")]
    mapped = [a for a in args if a.startswith("-XX:SharedArchiveFile=")]
    # unless a helper of the other xdist worker was writing it (the training's) or wrote it meanwhile
    assert dumping or mapped in ([f"-XX:SharedArchiveFile={trained}"], [f"-XX:SharedArchiveFile={full}"])
    assert not (dumping and mapped)  # a dumping JVM maps no dynamic archive
    bulk_helper._close_all()  # the helper exits and writes its archive
    _no_live_writer(full)
    flags, dump = bulk_helper.cds_options(home, "load")
    assert dump is None
    assert flags == [f"-XX:SharedArchiveFile={full}"]
    cmd = bulk_helper.java_command(home)
    cmd[1:1] = [*flags, "-XX:+PrintSharedArchiveAndExit"]
    listed = subprocess.run(cmd, input=b"", capture_output=True, check=False).stdout.decode(errors="replace")
    assert "org.apache.cassandra.streaming.StreamSession " in listed  # what the training never loads
    cmd = bulk_helper.java_command(home)
    cmd[1:1] = [*flags, "-Xshare:on"]
    run = subprocess.run(cmd, input=b"", capture_output=True, check=False)
    assert run.stdout.startswith(b"ERROR EOFException"), run.stderr[-2000:]
    assert trained.is_file()  # adopting one archive never removed the other
    assert bulk_helper.cds_options(home) == ([f"-XX:SharedArchiveFile={trained}"], None)


def test_a_round_that_fails_to_stream_is_answered_error_and_no_later_round_counts(
    target: tuple[Any, Any, Any],
) -> None:
    """Streaming fails (no node listens on the storage port given): the helper answers ERROR naming the stream and
    exits, the writer raises with that text, and neither that round nor the one written behind it counts."""
    written: list[str] = []
    bulk, settings, _session = target
    names = lambda split: ("data", "metadata")  # noqa: E731
    unreachable = dataclasses.replace(bulk, storage_port=9)  # the discard port: nothing listens there
    on_written = lambda r, n: written.append(r.rel_path)  # noqa: E731
    writer = BulkImageWriter(unreachable, settings, names, QuarantineLog(), on_written=on_written)
    with pytest.raises(bulk_helper.BulkLoadError, match="streaming") as failed, writer as w:  # noqa: PT012
        for i in range(300, 308):  # the second round's 'L' waits for the first round's answer
            w.write(_row(i))
    assert written == []
    assert "bulk-load helper" in str(failed.value)
