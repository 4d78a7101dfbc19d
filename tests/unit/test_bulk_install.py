"""`imgest bulk-helper install` (imgest.sinks.cassandra.bulk_install): the locked jars fetched from a repository and
checked, the platform's own jars taken instead, nothing half-installed after a failure, and a task that finds no
installed helper told what to run instead of building one.

The repository here is a folder served through ``file://`` URLs (the same code as for Maven Central's https ones);
the real lock fetched from the local Maven repository and a helper started from it: tests/packaging/test_provider.py.
"""

from __future__ import annotations

import hashlib
import re
import zipfile
from pathlib import Path

import pytest

from imgest.sinks.cassandra import bulk_build, bulk_helper, bulk_install
from imgest.sinks.cassandra.bulk_helper import READY, BulkLoadError
from imgest.sinks.cassandra.bulk_install import LockedJar


def _repo(tmp_path: Path, jars: dict[str, bytes]) -> tuple[str, list[LockedJar]]:
    root = tmp_path / "repo"
    locked = []
    for path, body in jars.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(body)
        locked.append(LockedJar(path, hashlib.sha256(body).hexdigest(), len(body)))
    return root.as_uri(), locked


@pytest.fixture
def homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The two places an installed helper may be, in a temporary folder; a packaged jar; no training run."""
    places = [tmp_path / "venv" / "bulk-helper" / "k1", tmp_path / "state" / "bulk-helper" / "k1"]
    monkeypatch.setattr(bulk_helper, "helper_homes", lambda: places)
    jar = tmp_path / "packaged" / "helper.jar"
    jar.parent.mkdir()
    jar.write_bytes(b"PK compiled")
    monkeypatch.setattr(bulk_install, "packaged_jar", lambda: jar)
    monkeypatch.setattr("imgest.sinks.cassandra.bulk_archive.train_archive", lambda home: None)
    return places


JARS = {
    "org/apache/cassandra/cassandra-all/5.0.9/cassandra-all-5.0.9.jar": b"cassandra classes",
    "com/example/dep/1.0/dep-1.0.jar": b"a dependency",
}


def test_install_fetches_the_locked_jars_and_a_task_then_finds_the_helper(
    homes: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repository, locked = _repo(tmp_path, JARS)
    monkeypatch.setattr(bulk_install, "locked_jars", lambda: locked)
    with pytest.raises(BulkLoadError, match=r"not installed here: run `imgest bulk-helper install`"):
        bulk_helper.ensure_helper()  # a task never builds it
    said: list[str] = []
    home = bulk_install.install_helper(repository, progress=said.append)
    assert home == homes[0]  # beside the environment, which is writable here
    assert sorted(p.name for p in (home / "lib").iterdir()) == ["cassandra-all-5.0.9.jar", "dep-1.0.jar"]
    assert (home / "lib" / "dep-1.0.jar").read_bytes() == b"a dependency"
    assert (home / "helper.jar").read_bytes() == b"PK compiled"
    assert (home / "logback.xml").is_file()
    assert (home / READY).is_file()
    assert said[0] == f"fetching 2 jars (0 MB) from {repository}"
    assert bulk_helper.ensure_helper() == home
    assert sorted(p.name for p in home.parent.iterdir()) == ["k1", "k1.zip"]  # no scratch folder left beside it
    with zipfile.ZipFile(home.parent / "k1.zip") as shipped:  # what Spark ships to executors, made by the install
        assert {"helper.jar", "lib/dep-1.0.jar", "lib/cassandra-all-5.0.9.jar", "logback.xml"} <= set(
            shipped.namelist()
        )
    again: list[str] = []
    assert bulk_install.install_helper("file:///nowhere", progress=again.append) == home  # nothing fetched again
    assert again == [f"the bulk-load helper is installed in {home}"]


def test_a_jar_that_is_not_the_locked_one_fails_the_install_and_leaves_nothing(
    homes: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repository, locked = _repo(tmp_path, JARS)
    (tmp_path / "repo" / "com/example/dep/1.0/dep-1.0.jar").write_bytes(b"a dependency, other bytes")
    monkeypatch.setattr(bulk_install, "locked_jars", lambda: locked)
    with pytest.raises(BulkLoadError, match=r"dep-1.0.jar is not the jar the lock names \(25 bytes, sha256 "):
        bulk_install.install_helper(repository, progress=lambda line: None)
    assert bulk_helper.installed() is None
    assert not homes[0].parent.exists() or list(homes[0].parent.iterdir()) == []  # nothing half-installed
    (tmp_path / "repo" / "com/example/dep/1.0/dep-1.0.jar").unlink()
    with pytest.raises(BulkLoadError, match=r"could not fetch file:///.*/dep-1.0.jar"):
        bulk_install.install_helper(repository, progress=lambda line: None)


def test_the_platform_s_cassandra_jars_instead_of_fetching(homes: list[Path], tmp_path: Path) -> None:
    lib = tmp_path / "cassandra" / "lib"
    lib.mkdir(parents=True)
    (lib / "guava-33.jar").write_bytes(b"g")
    with pytest.raises(BulkLoadError, match=r"holds no Cassandra 5.0 jar"):
        bulk_install.install_helper(jars=lib, progress=lambda line: None)
    (lib / "apache-cassandra-5.0.6.jar").write_bytes(b"c")  # a Cassandra 5.0 install's lib/ (its own jar's name)
    home = bulk_install.install_helper(jars=lib, progress=lambda line: None)
    assert sorted(p.name for p in (home / "lib").iterdir()) == ["apache-cassandra-5.0.6.jar", "guava-33.jar"]


def test_without_a_packaged_jar_the_install_says_how_to_get_one(
    homes: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk_install, "packaged_jar", lambda: None)
    with pytest.raises(BulkLoadError, match=r"no prebuilt helper.jar; install imgest from its wheel"):
        bulk_install.install_helper("file:///nowhere", progress=lambda line: None)
    monkeypatch.setattr(bulk_build, "tools", lambda: None)
    with pytest.raises(BulkLoadError, match=r"--build needs mvn and javac on PATH"):
        bulk_install.install_helper("file:///nowhere", build=True, progress=lambda line: None)
    assert bulk_helper.installed() is None


def test_the_lock_names_the_pom_s_cassandra_once_and_every_jar_once() -> None:
    locked = bulk_install.locked_jars()
    pom = bulk_helper.source("pom.xml").decode()
    version = re.search(r"<cassandra.version>([^<]+)<", pom)[1]  # type: ignore[index]
    assert [j.name for j in locked if j.name.startswith("cassandra-all-")] == [f"cassandra-all-{version}.jar"]
    assert len({j.name for j in locked}) == len(locked) > 50  # one folder of jars: no two of one file name
    assert all(re.fullmatch(r"[0-9a-f]{64}", j.sha256) and j.size > 0 for j in locked)
    assert bulk_build.LOCK in bulk_helper.SOURCES  # another lock is another helper (its key)


def test_the_jar_is_reproducible(tmp_path: Path) -> None:
    classes = tmp_path / "classes" / "dev" / "imgest"
    classes.mkdir(parents=True)
    (classes / "B.class").write_bytes(b"b")
    (classes / "A.class").write_bytes(b"a")
    bulk_build.pack(tmp_path / "classes", tmp_path / "one.jar")
    (classes / "A.class").touch()  # another time: the same bytes
    bulk_build.pack(tmp_path / "classes", tmp_path / "two.jar")
    assert (tmp_path / "one.jar").read_bytes() == (tmp_path / "two.jar").read_bytes()
