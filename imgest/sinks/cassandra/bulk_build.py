"""The bulk-load helper's jar compiled from its sources, and the lock of the jars it runs on.

Standard library only: setup.py loads this file by path (its build environment has none of imgest's dependencies)
to compile ``bulk/BulkWriter.java`` into ``bulk/helper.jar`` when the wheel is built, so that no task ever compiles
it. javac needs cassandra-all's classes: Maven resolves them (``dependency:copy-dependencies`` of ``bulk/pom.xml``)
into a scratch folder of the build. The jar is reproducible (sorted entries, fixed times), so the same sources give
the same bytes.

``bulk/runtime-jars.lock`` lists the jars the helper runs on (cassandra-all 5.0 and its runtime dependencies), each by
its path in a Maven repository, its sha256 and its size: ``imgest bulk-helper install`` fetches exactly those from
Maven Central (or a mirror) with no Maven on the host. ``python -m imgest.sinks.cassandra.bulk_build lock`` (``make
lock-bulk``) writes it from Maven's resolution of the pom.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

BULK = Path(__file__).resolve().parent / "bulk"
JAR = "helper.jar"
LOCK = "runtime-jars.lock"
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"  # where `imgest bulk-helper install` fetches the locked jars
JAVA_RELEASE = "17"  # the class files run on Java 17 (the executors' runtime) whatever JDK compiles them
ZIP_TIME = (1980, 1, 1, 0, 0, 0)


class BuildError(RuntimeError):
    """Maven or javac failed; the message names which and the log that says why."""


def _run(cmd: list[str], log_file: Path, what: str) -> None:
    with open(log_file, "ab") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0:
        tail = log_file.read_text(errors="replace")[-1500:]
        raise BuildError(f"bulk-load helper: {what} failed (exit {rc}); read {log_file}:\n{tail}")


def resolve(mvn: str, out: Path, log_file: Path, layout: bool = False) -> None:
    """cassandra-all and its runtime dependencies (bulk/pom.xml) copied by Maven into OUT, in a repository's layout
    (group/artifact/version/file) when LAYOUT."""
    cmd = [mvn, "-B", "-q", "-f", str(BULK / "pom.xml"), "dependency:copy-dependencies"]
    cmd += [f"-DoutputDirectory={out}", "-DincludeScope=runtime"]
    if layout:
        cmd.append("-Dmdep.useRepositoryLayout=true")
    _run(cmd, log_file, "Maven")


def compile_jar(jar: Path, mvn: str, javac: str, log_file: Path) -> Path:
    """BulkWriter.java compiled against the jars Maven resolves, packed reproducibly into JAR."""
    with tempfile.TemporaryDirectory(prefix="imgest-bulk-build-") as scratch:
        work = Path(scratch)
        resolve(mvn, work / "lib", log_file)
        classes = work / "classes"
        cmd = [javac, "--release", JAVA_RELEASE, "-nowarn", "-d", str(classes), "-cp", str(work / "lib" / "*")]
        _run([*cmd, str(BULK / "BulkWriter.java")], log_file, "javac")
        pack(classes, jar)
    return jar


def pack(classes: Path, jar: Path) -> None:
    """The compiled classes as a jar (a zip: no manifest is needed on a class path), entries sorted, times fixed."""
    tmp = jar.with_name(f".{jar.name}.partial")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zf:
        for path in sorted(classes.rglob("*.class")):
            info = zipfile.ZipInfo(path.relative_to(classes).as_posix(), ZIP_TIME)
            zf.writestr(info, path.read_bytes())
    tmp.replace(jar)


def lock_lines(repo: Path) -> list[str]:
    """One line per jar under REPO (a repository's layout): its path, sha256 and size."""
    lines = []
    for path in sorted(repo.rglob("*.jar")):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        lines.append(f"{path.relative_to(repo).as_posix()} {digest} {path.stat().st_size}")
    return lines


def write_lock(mvn: str, log_file: Path) -> Path:
    """bulk/runtime-jars.lock from Maven's resolution of bulk/pom.xml."""
    with tempfile.TemporaryDirectory(prefix="imgest-bulk-lock-") as scratch:
        resolve(mvn, Path(scratch), log_file, layout=True)
        lines = lock_lines(Path(scratch))
    head = "# The bulk-load helper's runtime jars: path in a Maven repository, sha256, bytes (make lock-bulk)\n"
    (BULK / LOCK).write_text(head + "\n".join(lines) + "\n")
    return BULK / LOCK


def tools() -> tuple[str, str] | None:
    """mvn and javac where both are on PATH (None otherwise)."""
    mvn, javac = shutil.which("mvn"), shutil.which("javac")
    return (mvn, javac) if mvn and javac else None


if __name__ == "__main__":  # python -m imgest.sinks.cassandra.bulk_build lock|jar
    found = tools()
    if found is None:
        sys.exit("bulk-load helper: needs mvn and javac on PATH")
    log = Path(tempfile.gettempdir()) / "imgest-bulk-build.log"
    if sys.argv[1:] == ["lock"]:
        print(write_lock(found[0], log))
    elif sys.argv[1:] == ["jar"]:
        print(compile_jar(BULK / JAR, *found, log))
    else:
        sys.exit("usage: python -m imgest.sinks.cassandra.bulk_build lock|jar")
