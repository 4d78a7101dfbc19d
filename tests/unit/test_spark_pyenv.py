"""The executors' shipped Python: settings, and the archive's layout (the build itself runs in
tests/jobs/test_no_shared_disk.py, where the workers cannot see this Python)."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

from imgest.core.errors import ConfigError
from imgest.spark import pyenv
from imgest.spark.conf import spark_conf


def test_nothing_shipped_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(pyenv.SETTING, raising=False)
    assert pyenv.executor_conf() == {}
    monkeypatch.setenv(pyenv.SETTING, "off")
    assert "spark.archives" not in spark_conf(master="spark://127.0.0.1:7077")


def test_a_packed_archive_is_shipped_to_cluster_executors_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    archive = tmp_path / "env.tar.gz"
    archive.write_bytes(b"")
    monkeypatch.setenv(pyenv.SETTING, str(archive))
    conf = spark_conf(master="spark://127.0.0.1:7077")
    assert conf["spark.archives"] == f"{archive}#imgest-env"
    assert conf["spark.pyspark.python"] == "./imgest-env/bin/python"
    assert conf["spark.pyspark.driver.python"] != conf["spark.pyspark.python"]  # the driver keeps this Python
    assert "spark.archives" not in spark_conf(master="local[2]")  # a local master's workers are this Python


def test_a_missing_archive_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(pyenv.SETTING, str(tmp_path / "nope.tar.gz"))
    with pytest.raises(ConfigError, match=r"nope\.tar\.gz': no such archive"):
        pyenv.executor_conf()


def test_pack_keeps_links_and_names_relative_to_the_env(tmp_path: Path) -> None:
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    (env / "lib" / "site-packages" / "__pycache__").mkdir(parents=True)
    (env / "lib" / "site-packages" / "m.py").write_text("x = 1\n")
    (env / "lib" / "site-packages" / "__pycache__" / "m.pyc").write_bytes(b"stale")
    os.symlink("/usr/bin/python3.11", env / "bin" / "python")
    out = tmp_path / "env.tar.gz"
    pyenv._pack(env, out)
    with tarfile.open(out) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert set(members) == {"bin", "bin/python", "lib", "lib/site-packages", "lib/site-packages/m.py"}
    assert members["bin/python"].issym()
    assert members["bin/python"].linkname == "/usr/bin/python3.11"


def test_pins_are_the_installed_versions() -> None:
    import importlib.metadata

    pins = dict(p.split("==") for p in pyenv.pins())
    assert set(pins) == set(pyenv.EXECUTOR_PACKAGES)
    assert pins["pyarrow"] == importlib.metadata.version("pyarrow")


def test_the_worker_daemon_is_imgest_only_on_local_masters() -> None:
    from imgest.spark.pypath import DAEMON_MODULE

    assert spark_conf(master="local[2]")["spark.python.daemon.module"] == DAEMON_MODULE
    for master in ("spark://127.0.0.1:7077", "spark://spark-master:7077", "yarn", "k8s://https://k:6443"):
        assert "spark.python.daemon.module" not in spark_conf(master=master)  # a task may bring imgest there
