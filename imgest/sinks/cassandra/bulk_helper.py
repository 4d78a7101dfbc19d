"""The bulk-load helper: a small JVM program (bulk/BulkWriter.java) that turns rows into SSTables with Cassandra's own
``CQLSSTableWriter`` and streams them to every replica with sstableloader's ``SSTableLoader``.

Installed before any task runs (``imgest bulk-helper install``: imgest.sinks.cassandra.bulk_install), into
``<venv>/share/imgest/bulk-helper/<key>/`` (or the state folder's ``bulk-helper/<key>/`` where the environment is
read-only): ``helper.jar`` (compiled when the wheel was built), ``lib/`` (cassandra-all and its runtime dependencies,
the jars bulk/runtime-jars.lock names) and the class-data-sharing archive of the classes a helper loads
(imgest.core.jvmcds): each helper then starts in about 1.7 CPU seconds instead of 2.5. A task never builds or
fetches it. A Spark executor starts one helper per Python worker and keeps it across partitions (its first view of
the ring costs seconds); rows go down its stdin in frames, and each round (``start_load``) is acknowledged
(``wait_load``) once its rows are on every replica. Nothing is acknowledged before that, so a killed helper loses
only unacknowledged rows, which a re-run writes again.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from imgest.core import defaults, jvmcds
from imgest.core.errors import ImgestError
from imgest.core.paths import state_dir
from imgest.sinks.cassandra.helper_cds import JAR, archive_name, run_archive_name

log = logging.getLogger(__name__)

# package data in imgest/sinks/cassandra/bulk/: what the installed helper is made of (its key)
SOURCES = ("BulkWriter.java", "pom.xml", "logback.xml", "runtime-jars.lock")
MAIN_CLASS = "dev.imgest.bulk.BulkWriter"
READY = ".built"
# The helper's work is copying bytes into SSTables: C1's code does it as fast as C2's and the JVM skips C2's
# compiles (measured over 4,000 / 8,000 110 KB rows: 3.6 / 4.5 CPU seconds against 7.2 / 8.3 with C2); one
# helper per core, so a serial collector. Metaspace starts large enough for Cassandra's classes (two full collections
# at start-up otherwise).
# The helper's SSTables are scratch files, deleted once streamed and never acknowledged before the nodes hold (and
# sync) their own copies: no fsync (Cassandra's SyncUtil honours cassandra.skip_sync), so a round's files need never
# reach the executor's disk.
JVM_FLAGS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-XX:MetaspaceSize=128m", "-Dcassandra.skip_sync=true"]
# Java 17 keeps these packages closed; Cassandra's client code reaches into them (its own jvm17 options).
JVM_OPENS = [
    "--add-exports=java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-exports=jdk.unsupported/sun.misc=ALL-UNNAMED",
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.reflect=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
]


class BulkLoadError(ImgestError):
    """The helper could not be built, started, or could not stream what it wrote; says which and why."""


def source(name: str) -> bytes:
    """A helper source file, read through the package's resources (so from a --py-files zip too)."""
    from importlib.resources import files

    return (files("imgest.sinks.cassandra") / "bulk" / name).read_bytes()


def helper_key() -> str:
    """Digest of the helper's sources (the Java file, its pom, its logging)."""
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update(source(name))
    return digest.hexdigest()[:12]


def helper_homes() -> list[Path]:
    """Where an installed helper may be, in order: beside the environment (installed with it, e.g. at an image's
    build), then the state folder (a host's own install where the environment is read-only)."""
    key = helper_key()
    return [Path(sys.prefix) / "share" / "imgest" / "bulk-helper" / key, state_dir() / "bulk-helper" / key]


def helper_dir() -> Path:
    """The installed helper's folder: the first of helper_homes that holds one, else where an install puts it (beside
    the environment where it is writable, else the state folder)."""
    homes = helper_homes()
    for home in homes:
        if (home / READY).is_file():
            return home
    venv = homes[0].parent
    try:
        venv.mkdir(parents=True, exist_ok=True)
        if os.access(venv, os.W_OK):
            return homes[0]
    except OSError:
        pass
    return homes[1]


def installed() -> Path | None:
    """The installed helper's folder, or None."""
    return next((home for home in helper_homes() if (home / READY).is_file()), None)


def tool(name: str, hint: str) -> str:
    found = shutil.which(name, path=os.pathsep.join(filter(None, [_java_bin(), os.environ.get("PATH", "")])))
    if not found:
        raise BulkLoadError(f"bulk-load helper: no {name} on PATH; {hint}")
    return found


def _java_bin() -> str:
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin") if home else ""


NOT_INSTALLED = (
    "the bulk-load helper is not installed here: run `imgest bulk-helper install` once where imgest is installed "
    "(an image's build, or the host; it fetches the locked jars from Maven Central or --repository), or use "
    "--write-path cql"
)


def ensure_helper() -> Path:
    """The installed helper's folder; a task never builds it (BulkLoadError saying what to run where it is not)."""
    home = installed()
    if home is None:
        raise BulkLoadError(f"{NOT_INSTALLED} (looked in {', '.join(str(h) for h in helper_homes())})")
    return home


def cds_options(home: Path, run: str | None = None) -> tuple[list[str], Path | None]:
    """The class-data archive flags for a helper started from HOME (jvmcds.options: map the archive, or dump one at
    exit when there is none yet) and the dump file. Only for the helper built here: one Spark unpacked elsewhere
    has another class path, which no archive matches.

    RUN: a real run's mode ("load", "cql"). The training's archive lacks what a run reads next (streaming, the
    driver): the first helper of each mode on the host dumps its own (run_archive_name); others map the training's."""
    try:
        if home.resolve() != helper_dir().resolve() or not (home / JAR).is_file():
            return [], None
        if run is not None and jvmcds.enabled():
            full = jvmcds.archive_path(run_archive_name(home, run), home / "lib")
            if jvmcds.adopt(full) or not jvmcds.live_writer(full):
                return jvmcds.options(run_archive_name(home, run), home / "lib")
        return jvmcds.options(archive_name(home), home / "lib")
    except (OSError, ImgestError) as exc:  # an executor without a usable state folder: start without one
        log.debug("bulk-load helper: no class-data archive (%s)", exc)
        return [], None


def helper_archive(home: Path) -> Path:
    """HOME as one zip beside it (stored, made once: by the install), which Spark ships to executors and unpacks
    there; in the state folder where HOME's folder is read-only."""
    archive = home.with_name(home.name + ".zip")
    if archive.is_file():
        return archive
    if not os.access(home.parent, os.W_OK):
        archive = state_dir() / "bulk-helper" / archive.name
        if archive.is_file():
            return archive
        archive.parent.mkdir(parents=True, exist_ok=True)
    import zipfile

    tmp = archive.with_name(f".{archive.name}.{os.getpid()}")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zf:
        for path in sorted(home.rglob("*")):
            if path.is_file():
                zf.write(path, path.relative_to(home).as_posix())
    tmp.replace(archive)
    return archive


# The JVM's own warnings (a class-data archive it cannot map, say) go to the helper's log: stdout carries replies.
JVM_LOG = ["-Xlog:disable", "-Xlog:all=warning:stderr"]


def java_command(home: Path, heap: str = defaults.BULK_HEAP) -> list[str]:
    java = tool("java", "install a Java 17 runtime on every Spark executor, or use --write-path cql")
    classpath = os.pathsep.join([str(home / JAR), str(home / "lib" / "*")])
    logging_conf = f"-Dlogback.configurationFile={home / 'logback.xml'}"
    return [java, f"-Xmx{heap}", *JVM_FLAGS, *JVM_LOG, *JVM_OPENS, logging_conf, "-cp", classpath, MAIN_CLASS]


# Rows go to the helper through a 1 MiB buffer and, where Linux allows it, a 1 MiB pipe (64 KiB by default): a small
# row costs a write call and a switch to the helper every few rows otherwise.
PIPE_BYTES = 1 << 20


def widen_pipe(stream: IO[bytes]) -> None:
    """Give STREAM's pipe PIPE_BYTES of kernel buffer where the system allows it (its default stays otherwise)."""
    import fcntl

    with contextlib.suppress(OSError, AttributeError, ValueError):
        fcntl.fcntl(stream.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)


_ROW_HEAD = struct.Struct(">cBH")
_LEN = struct.Struct(">i")
_NULL = _LEN.pack(-1)


def row_frame(table: int, values: Sequence[bytes | None]) -> bytes:
    """The 'R' command of one row of table TABLE: u8 table, u16 column count, each value as i32 length (-1: null)
    and its bytes."""
    parts = [_ROW_HEAD.pack(b"R", table, len(values))]
    for v in values:
        if v is None:
            parts.append(_NULL)
        else:
            parts.append(_LEN.pack(len(v)))
            parts.append(v)
    return b"".join(parts)


SCRATCH_PREFIX = "imgest-bulk-"  # + the Python worker's pid: its helper's log and its round's SSTables


def remove_stale_scratch(base: Path) -> int:
    """Remove the scratch folders under BASE whose Python worker is gone (Spark ends its workers without their
    exit handlers, so a helper's folder outlives it); returns how many."""
    removed = 0
    for folder in base.glob(SCRATCH_PREFIX + "*"):
        pid = folder.name[len(SCRATCH_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
        except OSError:  # alive, another user's
            continue
    return removed


class BulkHelper:
    """One helper process: ``add`` rows of the header's tables, ``load`` them, ``close``."""

    def __init__(self, home: Path, header: dict[str, Any]) -> None:
        remove_stale_scratch(Path(tempfile.gettempdir()))
        self.scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-"))
        self._stderr = open(self.scratch / "helper.log", "wb")  # noqa: SIM115 - lives as long as the process
        cmd = java_command(home)
        flags, dump = cds_options(home, "cql" if header.get("mode") == "cql" else "load")
        cmd[1:1] = flags
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, bufsize=PIPE_BYTES
        )
        jvmcds.writer(dump, self._proc.pid)
        widen_pipe(self._stdin())
        body = json.dumps({**header, "dir": str(self.scratch / "sstables")}).encode()
        self._send(struct.pack(">I", len(body)) + body)
        self._stdin().flush()  # now: the helper reads the ring while the first rows are made (seconds)
        self.sent = 0  # rows sent since the last load
        self.refused: list[tuple[int, str, str]] = []  # CQL mode: the last round's rows refused for good
        self.resent = 0  # CQL mode: requests sent again before the last reply
        self._loading: deque[int] = deque()  # rows of each round started and not yet acknowledged, oldest first

    def _stdin(self) -> IO[bytes]:
        assert self._proc.stdin is not None
        return self._proc.stdin

    def _send(self, frame: bytes) -> None:
        try:
            self._stdin().write(frame)
        except (BrokenPipeError, OSError):
            raise self._died("took no more rows") from None

    def add(self, table: int, values: Sequence[bytes | None]) -> None:
        """Queue one row of table TABLE (index in the header's list); VALUES serialized as CQL does."""
        self._send(row_frame(table, values))
        self.sent += 1

    def start_load(self) -> None:
        """Close the round of the rows sent so far; the helper streams it while the next round's rows arrive."""
        self._send(b"L")
        try:
            self._stdin().flush()
        except (BrokenPipeError, OSError):
            raise self._died("took no more rows") from None
        self._loading.append(self.sent)
        self.sent = 0

    def wait_load(self) -> int:
        """Wait until the oldest round started is on every replica; returns its rows. Raises BulkLoadError when the
        helper failed it or acknowledged another count than was sent. In CQL mode the rows the cluster refused for
        good are in ``refused`` afterwards (index in the round, "too_large" or "error", the driver's message) and
        the requests sent again since the last reply in ``resent``."""
        assert self._proc.stdout is not None
        self.refused = []
        while (reply := self._reply(self._proc.stdout)).startswith("BAD "):
            index, kind, message = reply.removeprefix("BAD ").split(" ", 2)
            self.refused.append((int(index), kind, message))
        if not reply.startswith("OK "):
            raise self._died(reply.removeprefix("ERROR ") or "stopped without a reply")
        fields = reply.split()
        rows, expected = int(fields[1]), self._loading.popleft()
        self.resent = int(fields[3]) if len(fields) > 3 else 0
        if rows != expected:
            raise BulkLoadError(f"bulk-load helper acknowledged {rows} rows of the {expected} sent")
        return rows

    @property
    def loading(self) -> int:
        """Rounds started and not yet acknowledged."""
        return len(self._loading)

    def _reply(self, out: IO[bytes]) -> str:
        """The helper's next reply line; anything else the JVM printed on stdout (a -XX option's notice from
        JAVA_TOOL_OPTIONS, say) goes to its log. Empty when the helper exited."""
        while line := out.readline():
            text = line.decode(errors="replace").strip()
            if text.startswith(("OK ", "ERROR ", "BAD ")):
                return text
            self._stderr.write(b"stdout: " + line)
        return ""

    def _died(self, what: str) -> BulkLoadError:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        reply = self._proc.stdout.read().decode(errors="replace").strip() if self._proc.stdout else ""
        tail = (self.scratch / "helper.log").read_text(errors="replace").strip().splitlines()[-8:]
        tail = [*(reply.removeprefix("ERROR ").splitlines()), *tail]
        self._cleanup()
        return BulkLoadError(f"bulk-load helper {what}; its log ends:\n" + "\n".join(tail))

    def close(self) -> None:
        """Quit after the last load (rows sent since then are dropped: they were never acknowledged)."""
        if self._proc.poll() is None:
            try:
                self._stdin().write(b"Q")
                self._stdin().close()
                self._proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
        self._cleanup()

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._cleanup()

    def _cleanup(self) -> None:
        self._stderr.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


_HELPERS: dict[str, BulkHelper] = {}
_LOCK = threading.Lock()


def shared_helper(home: Path, header: dict[str, Any]) -> BulkHelper:
    """The executor process's helper for HEADER, kept across partitions (closed at exit); one at a time: a job with
    another header (a reused Python worker) closes the previous one."""
    key = hashlib.sha256(json.dumps([str(home), header], sort_keys=True).encode()).hexdigest()
    with _LOCK:
        for other in [k for k in _HELPERS if k != key]:
            _HELPERS.pop(other).close()
        helper = _HELPERS.get(key)
        if helper is None or helper._proc.poll() is not None:
            helper = _HELPERS[key] = BulkHelper(home, header)
        return helper


def drop_helper(helper: BulkHelper) -> None:
    """Kill HELPER (a partition failed with rows unacknowledged) so the next partition starts clean."""
    with _LOCK:
        for key, h in list(_HELPERS.items()):
            if h is helper:
                del _HELPERS[key]
    helper.kill()


@atexit.register
def _close_all() -> None:
    for helper in list(_HELPERS.values()):
        helper.close()
    _HELPERS.clear()
