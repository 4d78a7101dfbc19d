"""Class-data-sharing archives of the JVMs imgest starts: keys, the dump's hand-over, and a real Spark driver
that maps the archive the install built (``-Xshare:on`` fails the JVM when it cannot)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from imgest.core import jvmcds
from imgest.spark import cds
from imgest.spark.conf import spark_conf, submit_env


@pytest.fixture
def archives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(jvmcds, "archive_dir", lambda: tmp_path / "cds")
    (tmp_path / "cds").mkdir()
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "a.jar").write_bytes(b"a" * 10)
    return jars


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_key_follows_the_jars(archives: Path) -> None:
    before = jvmcds.archive_key(archives)
    (archives / "b.jar").write_bytes(b"b")
    assert jvmcds.archive_key(archives) != before
    (archives / "b.jar").unlink()
    assert jvmcds.archive_key(archives) == before
    jar = next(archives.glob("*.jar"))
    st = jar.stat()
    os.utime(jar, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # the same bytes, reinstalled: the JVM
    assert jvmcds.archive_key(archives) != before  # refuses an archive whose jars' times changed


def test_a_dump_is_adopted_only_once_its_writer_exited(archives: Path) -> None:
    flags, dump = jvmcds.options("demo", archives)
    assert dump is not None
    assert flags == [f"-XX:ArchiveClassesAtExit={dump}"]
    jvmcds.writer(dump, os.getpid())  # a live writer: its dump is not final yet
    dump.write_bytes(b"archive")
    path = jvmcds.archive_path("demo", archives)
    assert not jvmcds.adopt(path)
    assert dump.exists()
    jvmcds.writer(dump, _dead_pid())
    assert jvmcds.adopt(path)
    assert path.read_bytes() == b"archive"
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
    assert jvmcds.options("demo", archives) == ([f"-XX:SharedArchiveFile={path}"], None)


def test_while_one_writer_runs_other_jvms_dump_nothing(archives: Path) -> None:
    _, dump = jvmcds.options("demo", archives)
    assert dump is not None
    jvmcds.writer(dump, os.getpid())  # a live writer
    assert jvmcds.options("demo", archives) == ([], None)  # a second JVM: no archive to map, no second dump
    jvmcds.writer(dump, _dead_pid())  # the writer was killed before it wrote: the next JVM writes
    flags, second = jvmcds.options("demo", archives)
    assert second is not None
    assert flags == [f"-XX:ArchiveClassesAtExit={second}"]


def test_markers_of_killed_writers_and_archives_of_old_jars_are_dropped(archives: Path) -> None:
    old = jvmcds.archive_path("demo", archives)
    old.write_bytes(b"old")
    (archives / "b.jar").write_bytes(b"b")  # a changed class path: a new key
    _, dump = jvmcds.options("demo", archives)
    jvmcds.writer(dump, _dead_pid())  # killed before it wrote anything
    new = jvmcds.archive_path("demo", archives)
    assert not jvmcds.adopt(new)
    assert sorted(p.name for p in new.parent.iterdir()) == [old.name]
    new.write_bytes(b"new")
    assert jvmcds.adopt(new)
    assert sorted(p.name for p in new.parent.iterdir()) == [new.name]


def test_archives_of_earlier_builds_of_a_family_are_pruned(archives: Path) -> None:
    """A rebuilt helper has another name (its key, its jar's place and stamp): beyond the three newest others, the
    archives of builds before it are removed once a day old; the other JVMs' archives stay. The newest stay for
    other state folders sharing the folder, which name their own helpers' archives."""
    import time

    folder = jvmcds.archive_dir()
    current = jvmcds.archive_path("bulk-helper-new", archives)
    now = time.time()
    for n, age_h in enumerate((1, 2, 3, 30, 40)):  # five earlier builds, the last two over a day old
        old = jvmcds.archive_path(f"bulk-helper-old{n}", archives)
        old.write_bytes(b"x")
        os.utime(old, (now - age_h * 3600, now - age_h * 3600))
    for name in ("cassandra", "spark-driver"):
        jvmcds.archive_path(name, archives).write_bytes(b"x")
    current.write_bytes(b"new")
    gone = jvmcds.prune_family(current, "bulk-helper-")
    assert sorted(p.name.rsplit("-", 1)[0] for p in gone) == ["bulk-helper-old3", "bulk-helper-old4"]
    left = sorted(p.name.rsplit("-", 1)[0] for p in folder.iterdir())
    assert left == ["bulk-helper-new", *(f"bulk-helper-old{n}" for n in range(3)), "cassandra", "spark-driver"]
    assert jvmcds.prune_family(current, "bulk-helper-", keep=0, min_age_s=9000) == [
        jvmcds.archive_path("bulk-helper-old2", archives)
    ]


def test_agents_may_be_archived_and_the_switch_turns_it_all_off(
    archives: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flags, _ = jvmcds.options("demo", archives, agent=True)
    assert flags[:2] == ["-XX:+UnlockDiagnosticVMOptions", "-XX:+AllowArchivingWithJavaAgent"]
    monkeypatch.setenv("IMGEST_JVM_CDS", "0")
    assert jvmcds.options("demo", archives) == ([], None)
    assert cds.java_options() == ""


@pytest.mark.slow
def test_a_spark_driver_maps_the_installed_archive(tmp_path: Path) -> None:
    path = cds.archive_path()
    assert path is not None
    assert path.is_file(), "the install builds it: python -m imgest.spark.cds"
    assert f"-XX:SharedArchiveFile={path}" in spark_conf()["spark.driver.extraJavaOptions"]
    script = tmp_path / "job.py"
    script.write_text(
        "from pyspark.sql import SparkSession\n"
        "s = SparkSession.builder.getOrCreate()\n"
        "print('rows', s.range(7).count())\n"
        "s.stop()\n"
    )
    conf = spark_conf(master="local[1]")
    conf["spark.driver.extraJavaOptions"] += " -Xshare:on"  # the JVM refuses to start if it cannot map it
    from imgest.spark.distribution import spark_submit

    cmd = [spark_submit(), "--master", "local[1]"]
    for key, value in conf.items():
        cmd += ["--conf", f"{key}={value}"]
    proc = subprocess.run(
        [*cmd, str(script)], env=submit_env("local[1]"), capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rows 7" in proc.stdout
