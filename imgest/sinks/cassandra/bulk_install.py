"""``imgest bulk-helper install``: the bulk-load helper put in place on a host before any task needs it.

A task never builds or fetches the helper (imgest.sinks.cassandra.bulk_helper.ensure_helper says what to run where it
is missing). The install assembles ``<IMGEST_HOME>/bulk-helper/<digest>/`` from:

- ``helper.jar``: compiled from BulkWriter.java when the wheel was built, shipped in it (``--build`` compiles it here
  instead, for a source checkout: needs javac and Maven; imgest.sinks.cassandra.bulk_build);
- ``lib/``: the jars of ``bulk/runtime-jars.lock`` fetched from a Maven repository (Maven Central by default, or the
  platform's mirror: ``--repository``, a ``file://`` one included), each checked against its sha256 and size, with
  no Maven on the host; or ``--jars DIR``: the platform's own Cassandra 5.0 jars (its ``lib/`` folder), copied as
  they are;
- then the zip of it that Spark ships to the executors (bulk_helper.helper_archive), and the class-data archive's
  training run (imgest.sinks.cassandra.bulk_archive).

It builds in a scratch folder beside the target and renames it into place: a failed or interrupted install leaves
nothing a task would take for an installed helper.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import tempfile
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from imgest.sinks.cassandra import bulk_build
from imgest.sinks.cassandra.bulk_helper import READY, BulkLoadError, helper_dir, helper_key, source

log = logging.getLogger(__name__)

MAVEN_CENTRAL = bulk_build.MAVEN_CENTRAL
FETCH_THREADS = 8
CASSANDRA_JAR = re.compile(r"^(cassandra-all|apache-cassandra)-5\.0\.[0-9]+\.jar$")  # the classes the helper needs


@dataclass(frozen=True)
class LockedJar:
    path: str  # in a Maven repository's layout
    sha256: str
    size: int

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


def locked_jars() -> list[LockedJar]:
    """The jars bulk/runtime-jars.lock names."""
    text = source(bulk_build.LOCK).decode()
    jars = []
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            path, digest, size = line.split()
            jars.append(LockedJar(path, digest, int(size)))
    return jars


def fetch(jar: LockedJar, repository: str, dest: Path) -> int:
    """JAR from REPOSITORY into DEST (by its file name), checked against its sha256 and size; its bytes."""
    url = f"{repository.rstrip('/')}/{jar.path}"
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            body = response.read()
    except OSError as exc:
        raise BulkLoadError(f"bulk-load helper: could not fetch {url}: {exc}") from None
    digest = hashlib.sha256(body).hexdigest()
    if len(body) != jar.size or digest != jar.sha256:
        raise BulkLoadError(
            f"bulk-load helper: {url} is not the jar the lock names ({len(body)} bytes, sha256 {digest}; the lock: "
            f"{jar.size} bytes, sha256 {jar.sha256}): a mirror serving other bytes, or a truncated download"
        )
    (dest / jar.name).write_bytes(body)
    return len(body)


def fetch_all(repository: str, dest: Path, progress: Callable[[str], None] = log.info) -> int:
    """Every locked jar from REPOSITORY into DEST, FETCH_THREADS at a time; their bytes."""
    jars = locked_jars()
    total = sum(j.size for j in jars)
    progress(f"fetching {len(jars)} jars ({total / 1e6:.0f} MB) from {repository}")
    dest.mkdir(parents=True, exist_ok=True)
    done = 0
    with ThreadPoolExecutor(FETCH_THREADS) as pool:
        for k, size in enumerate(pool.map(lambda j: fetch(j, repository, dest), jars), 1):
            done += size
            if k % 20 == 0 or k == len(jars):
                progress(f"  {k} of {len(jars)} jars, {done / 1e6:.0f} of {total / 1e6:.0f} MB")
    return done


def copy_platform_jars(jars: Path, dest: Path) -> int:
    """The platform's Cassandra 5.0 jars (every *.jar in JARS) copied into DEST; how many. Refuses a folder without
    Cassandra 5.0's own jar."""
    found = sorted(jars.glob("*.jar"))
    if not any(CASSANDRA_JAR.match(p.name) for p in found):
        raise BulkLoadError(
            f"bulk-load helper: {jars} holds no Cassandra 5.0 jar (cassandra-all-5.0.*.jar or "
            "apache-cassandra-5.0.*.jar): give the lib/ folder of a Cassandra 5.0 install, or fetch the locked jars"
        )
    dest.mkdir(parents=True, exist_ok=True)
    for path in found:
        shutil.copyfile(path, dest / path.name)
    return len(found)


def packaged_jar() -> Path | None:
    """helper.jar as the wheel shipped it (None in a source checkout that never compiled it)."""
    jar = files("imgest.sinks.cassandra") / "bulk" / bulk_build.JAR
    return Path(str(jar)) if jar.is_file() else None


def helper_jar(build: bool, scratch: Path, progress: Callable[[str], None]) -> Path:
    """The helper's compiled jar: the packaged one, or with BUILD one compiled into SCRATCH."""
    jar = packaged_jar()
    if jar is not None and not build:
        return jar
    found = bulk_build.tools()
    if not build or found is None:
        why = "this install has no prebuilt helper.jar" if not build else "--build needs mvn and javac on PATH"
        raise BulkLoadError(
            f"bulk-load helper: {why}; install imgest from its wheel (which ships the jar), or run `imgest "
            "bulk-helper install --build` where a JDK 17 and Maven are installed"
        )
    progress("compiling BulkWriter.java (Maven resolves cassandra-all for javac)")
    try:
        return bulk_build.compile_jar(scratch / bulk_build.JAR, *found, scratch / "build.log")
    except bulk_build.BuildError as exc:
        raise BulkLoadError(str(exc)) from None


def install_helper(
    repository: str = MAVEN_CENTRAL,
    jars: Path | None = None,
    build: bool = False,
    progress: Callable[[str], None] = log.info,
) -> Path:
    """The helper installed into its folder (see the module); the folder. Nothing is done where it is installed."""
    home = helper_dir()
    if (home / READY).is_file():
        progress(f"the bulk-load helper is installed in {home}")
        return home
    home.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=home.name + ".", dir=home.parent))
    try:
        jar = helper_jar(build, tmp, progress)
        if jars is not None:
            progress(f"copied {copy_platform_jars(jars, tmp / 'lib')} jars from {jars}")
        else:
            fetch_all(repository, tmp / "lib", progress)
        if jar.parent != tmp:
            shutil.copyfile(jar, tmp / bulk_build.JAR)
        (tmp / "logback.xml").write_bytes(source("logback.xml"))
        (tmp / "build.log").unlink(missing_ok=True)
        (tmp / READY).write_text(helper_key() + "\n")
        try:
            tmp.rename(home)
        except OSError:  # another install put it in place meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    from imgest.sinks.cassandra.bulk_archive import train_archive
    from imgest.sinks.cassandra.bulk_helper import helper_archive

    helper_archive(home)  # what Spark ships to the executors, made here and not by a task
    archive = train_archive(home)
    progress(f"installed the bulk-load helper in {home}" + (f" (class-data archive {archive})" if archive else ""))
    return home
