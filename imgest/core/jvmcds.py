"""Class-data-sharing archives for the JVMs imgest starts (Spark drivers, Cassandra nodes, nodetool).

On a small machine most of a short JVM's life is loading and verifying classes: Spark and Cassandra each load
about 10,000. JDK 13+ dumps the classes one run loaded into an archive (``-XX:ArchiveClassesAtExit``, written
when the JVM exits, SIGTERM included) that later JVMs map instead of parsing their jars again
(``-XX:SharedArchiveFile``). An archive is only valid for the exact JVM and class path that wrote it, so its name
carries a digest of the Java release and the jar list; a JVM that cannot use one runs without it
(``-Xshare:auto``, the default). ``IMGEST_JVM_CDS=0`` turns them all off.

A writer dumps to ``.<name>-<key>.jsa.<pid>``; ``adopt`` renames a finished dump (its JVM has exited) into place,
so readers never map a partial archive and concurrent writers never clash. While one writer runs, other JVMs of
the same archive start without one and dump nothing (a dump costs seconds of CPU at the JVM's exit, and only
one of them is kept).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import sys
import time
from pathlib import Path

from imgest.core.paths import state_dir
from imgest.core.pids import pid_alive


def enabled() -> bool:
    """False when $IMGEST_JVM_CDS is 0."""
    return os.environ.get("IMGEST_JVM_CDS", "1") != "0"


def java_release() -> str:
    """The text of $JAVA_HOME/release (or that of the java on PATH): it names the exact JVM build."""
    home = os.environ.get("JAVA_HOME")
    if not home:
        java = shutil.which("java")
        home = str(Path(java).resolve().parent.parent) if java else ""
    release = Path(home) / "release"
    return release.read_text(errors="replace") if release.is_file() else home


def archive_key(jars: Path) -> str:
    """Digest of the JVM build and the jars (names, sizes and modification times) of the folder JARS. The JVM
    refuses an archive whose class path jars changed either (silently, under -Xshare:auto): a reinstall of the
    same jars (pyspark's, by the install) gave them new times, and every Spark driver ran without its archive."""
    digest = hashlib.sha256(java_release().encode())
    for jar in sorted(jars.glob("*.jar")) if jars.is_dir() else ():
        st = jar.stat()
        digest.update(f"{jar.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def archive_dir() -> Path:
    """Beside the venv when writable (archives belong to its jars), else in the state folder."""
    venv = Path(sys.prefix) / "share" / "imgest" / "jvm-cds"
    try:
        venv.mkdir(parents=True, exist_ok=True)
        if os.access(venv, os.W_OK):
            return venv
    except OSError:
        pass
    path = state_dir() / "jvm-cds"
    path.mkdir(parents=True, exist_ok=True)
    return path


def archive_path(name: str, jars: Path) -> Path:
    """The archive of the JVM NAME whose class path is the jars in JARS (it may not exist yet)."""
    return archive_dir() / f"{name}-{archive_key(jars)}.jsa"


def _writer_pid(marker: Path) -> str:
    """The pid a dump's marker names ('' unreadable, 'gone' when another process removed it meanwhile)."""
    try:
        return marker.read_text().strip()
    except FileNotFoundError:
        return "gone"


def adopt(path: Path) -> bool:
    """Move a finished dump of PATH into place (its writer, named in the dump's .pid file, has exited); drop
    archives of other keys. True if PATH exists."""
    for tmp in path.parent.glob(f".{path.name}.*"):
        if tmp.suffix == ".pid":
            pid = _writer_pid(tmp)
            if pid != "gone" and not tmp.with_suffix("").exists() and not (pid.isdigit() and pid_alive(int(pid))):
                tmp.unlink(missing_ok=True)  # its JVM exited without writing (killed, or failed to start)
            continue
        marker = tmp.with_name(tmp.name + ".pid")
        pid = _writer_pid(marker)
        if pid.isdigit() and pid_alive(int(pid)):
            continue  # still running: it writes at exit
        try:
            if not pid.isdigit() and time.time() - tmp.stat().st_mtime < 600:
                continue  # its writer has not been named yet
            if tmp.stat().st_size > 0 and not path.exists():
                tmp.replace(path)
            else:
                tmp.unlink(missing_ok=True)
        except FileNotFoundError:
            continue  # another process adopted it meanwhile
        marker.unlink(missing_ok=True)
    if path.exists():
        stem = path.name.rsplit("-", 1)[0]
        for old in path.parent.glob(f"{stem}-*.jsa"):
            if old != path:
                old.unlink(missing_ok=True)
    return path.exists()


def prune_family(path: Path, family: str, keep: int = 3, min_age_s: float = 24 * 3600) -> list[Path]:
    """Remove the archives beside PATH whose names start with FAMILY, other than PATH and the KEEP newest others,
    once unchanged for MIN_AGE_S (those of a helper built before, or from a jar since moved: nothing maps them
    again; about 40 MB each). The newest are kept for other state folders that share this folder (each names its
    own helper's archive), so that they do not remove each other's. A JVM that maps one keeps its mapping. Returns
    what was removed."""
    others = []
    for old in path.parent.glob(f"{family}*.jsa"):
        with contextlib.suppress(FileNotFoundError):
            if old != path:
                others.append((old.stat().st_mtime, old))
    others.sort(reverse=True)
    gone = []
    for mtime, old in others[keep:]:
        if time.time() - mtime >= min_age_s:
            old.unlink(missing_ok=True)
            gone.append(old)
    return gone


def live_writer(path: Path) -> bool:
    """True while a running JVM is named as the writer of a dump of PATH."""
    for marker in path.parent.glob(f".{path.name}.*.pid"):
        pid = _writer_pid(marker)
        if pid.isdigit() and pid_alive(int(pid)):
            return True
    return False


def options(name: str, jars: Path, agent: bool = False) -> tuple[list[str], Path | None]:
    """JVM flags for NAME: map its archive when it exists, else dump one at exit. Returns the flags and the dump
    file, whose writer the caller names with ``writer(dump, pid)`` once the JVM runs (None when mapping). AGENT:
    the JVM runs a Java agent, which a dump must be allowed to archive alongside."""
    if not enabled():
        return [], None
    path = archive_path(name, jars)
    if adopt(path):
        return [f"-XX:SharedArchiveFile={path}"], None
    if live_writer(path):  # one dump is enough: a second would cost CPU at exit and be thrown away
        return [], None
    dump = path.parent / f".{path.name}.{secrets.token_hex(4)}"
    allow = ["-XX:+UnlockDiagnosticVMOptions", "-XX:+AllowArchivingWithJavaAgent"] if agent else []
    return [*allow, f"-XX:ArchiveClassesAtExit={dump}"], dump


def writer(dump: Path | None, pid: int | None) -> None:
    """Name PID as the JVM that writes DUMP at its exit (no-op without a dump)."""
    if dump is not None and pid:
        dump.with_name(dump.name + ".pid").write_text(f"{pid}\n")
