"""imgest.spark.distribution: which Spark runs jobs ($SPARK_HOME, imgest's install beside the environment, a pyspark
of the environment), never pyspark-client's files, and what a user reads where there is none."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

from imgest.core.errors import ConfigError
from imgest.spark import distribution, pypath


def _spark(folder: Path) -> Path:
    """A Spark folder: bin/spark-submit, jars/, its source zips."""
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "spark-submit").write_text("#!/bin/sh\n")
    (folder / "jars").mkdir()
    (folder / "python" / "lib").mkdir(parents=True)
    for name in ("pyspark.zip", "py4j-0.10.9.9-src.zip"):
        (folder / "python" / "lib" / name).write_bytes(b"")
    return folder


@pytest.fixture
def no_spark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No SPARK_HOME, imgest's install looked for under TMP_PATH, and the environment's pyspark pyspark-client's
    files (no bin/, no jars/)."""
    client = tmp_path / "site-packages" / "pyspark"
    client.mkdir(parents=True)
    (client / "__init__.py").write_text("")
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.setattr(
        distribution, "homes", lambda version=distribution.PYSPARK_VERSION: [tmp_path / "share" / f"pyspark-{version}"]
    )
    found = SimpleNamespace(origin=str(client / "__init__.py"))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: found if name == "pyspark" else real(name, *a))
    return tmp_path


def test_pyspark_client_alone_is_no_spark_and_the_error_says_what_to_do(no_spark: Path) -> None:
    assert distribution.spark_home() is None
    with pytest.raises(ConfigError, match=r"imgest spark install.*pyspark-client"):
        distribution.spark_submit()
    assert distribution.spark_env({"PATH": "/usr/bin"}) == {"PATH": "/usr/bin"}
    assert distribution.python_path() == []


def test_imgest_s_install_once_ready(no_spark: Path) -> None:
    folder = no_spark / "share" / "pyspark-4.3.0"
    home = _spark(folder / "pyspark")
    assert distribution.spark_home() is None  # not finished: no READY
    (folder / pypath.READY).write_text("4.3.0\n")
    assert distribution.spark_home() == home.resolve()
    assert distribution.spark_submit() == str(home.resolve() / "bin" / "spark-submit")
    env = distribution.spark_env({"PATH": "/usr/bin", "HOME": "/h"})
    assert env == {"PATH": f"{home.resolve()}/bin:/usr/bin", "HOME": "/h", "SPARK_HOME": str(home.resolve())}
    assert distribution.python_path() == [str(folder.resolve())]  # pyspark and py4j, compiled, in that folder


def test_the_platform_s_spark_home_comes_first(no_spark: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = no_spark / "share" / "pyspark-4.3.0"
    _spark(folder / "pyspark")
    (folder / pypath.READY).write_text("4.3.0\n")
    platform = _spark(no_spark / "opt" / "spark")
    monkeypatch.setenv("SPARK_HOME", str(platform))
    assert distribution.spark_home() == platform.resolve()
    lib = platform.resolve() / "python" / "lib"
    assert distribution.python_path() == [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]
    monkeypatch.setenv("SPARK_HOME", str(no_spark / "nothing-here"))  # a SPARK_HOME that holds no Spark: ignored
    assert distribution.spark_home() == (folder / "pyspark").resolve()


def test_an_environment_s_own_pyspark_with_its_jars(no_spark: Path) -> None:
    _spark(no_spark / "site-packages" / "pyspark")  # pip's pyspark, as a user installed it
    home = (no_spark / "site-packages" / "pyspark").resolve()
    assert distribution.spark_home() == home
    assert distribution.python_path() == []  # importable already


def test_a_failed_install_leaves_nothing(no_spark: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distribution, "_installer", lambda *a: ["sh", "-c", "echo 'no such version' >&2; exit 1"])
    with pytest.raises(ConfigError, match=r"pyspark 9\.9\.9 did not install: no such version"):
        distribution.install("9.9.9", progress=lambda line: None)
    assert list((no_spark / "share").iterdir()) == []


def test_the_pinned_spark_is_the_one_installed_by_default() -> None:
    from imgest.core.paths import repo_root

    root = repo_root()
    assert root is not None
    pins = [
        line for line in (root / "requirements" / "spark.txt").read_text().splitlines() if line.startswith("pyspark==")
    ]
    assert pins == [f"pyspark=={distribution.PYSPARK_VERSION}"]
    for lock in ("runtime.lock", "dev.lock", "bench.lock"):  # never among the environment's packages
        assert "\npyspark==" not in (root / "requirements" / lock).read_text(), lock


def test_an_install_of_another_version_is_found(no_spark: Path) -> None:
    """`imgest spark install --version V`: the Spark jobs then run is V's (the highest of several)."""
    for version in ("4.1.1", "4.2.1", "4.10.0"):
        folder = no_spark / "share" / f"pyspark-{version}"
        _spark(folder / "pyspark")
        (folder / pypath.READY).write_text(version + "\n")
    assert distribution.spark_home() == (no_spark / "share" / "pyspark-4.10.0" / "pyspark").resolve()
    own = no_spark / "share" / f"pyspark-{distribution.PYSPARK_VERSION}"
    _spark(own / "pyspark")
    (own / pypath.READY).write_text("\n")
    assert distribution.spark_home() == (own / "pyspark").resolve()  # the pinned one first
