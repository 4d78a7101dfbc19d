"""imgest.spark.pypath: Spark's source zips are dropped from a path only where the install recorded the installed
pyspark's files as the zip's, and nothing changed since."""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

import pytest

from imgest.spark import pypath

FILES = {name: f"# {name}\n" for name in (*pypath.WATCHED, "extra.py")}


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A site-packages with pyspark (its zips under pyspark/python/lib, as pip installs it) and py4j's dist-info;
    the record in TMP_PATH."""
    site = tmp_path / "site"
    _spark_package(site)
    monkeypatch.setattr(pypath, "record_path", lambda package=None: tmp_path / "record.json")
    return site


def _spark_package(site: Path) -> None:
    """pyspark as pip installs it into SITE (its zips under pyspark/python/lib), with py4j and its dist-info."""
    package = site / "pyspark"
    lib = package / "python" / "lib"
    lib.mkdir(parents=True)
    for name, text in FILES.items():
        (package / name).write_text(text)
    with zipfile.ZipFile(lib / "pyspark.zip", "w") as zipped:
        for name, text in FILES.items():
            zipped.writestr(f"pyspark/{name}", text)
        zipped.writestr("pyspark/tests/test_x.py", "# not in the wheel\n")
        zipped.writestr("pyspark/sql/streaming/benchmark/b.py", "# not in the wheel\n")
    with zipfile.ZipFile(lib / "py4j-0.10.9.9-src.zip", "w") as zipped:
        zipped.writestr("py4j/__init__.py", "")
    (site / "py4j-0.10.9.9.dist-info").mkdir()
    (site / "py4j").mkdir()
    (site / "py4j" / "__init__.py").write_text("")


def spark_path(site: Path) -> list[str]:
    lib = site / "pyspark" / "python" / "lib"
    return [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip"), "/somewhere/jobs", str(site)]


def test_dropped_only_once_recorded_same(site: Path) -> None:
    path = spark_path(site)
    assert pypath.zips_of_installed_pyspark(path) == []  # no record: Spark's zips stay
    record = pypath.write_record(site / "pyspark")
    assert record["same"]
    assert record["differing"] == []
    assert pypath.zips_of_installed_pyspark(path) == path[:2]
    assert pypath.zips_of_installed_pyspark(path[:3]) == []  # the package is not on the path after the zip


def test_a_changed_install_keeps_the_zips(site: Path) -> None:
    path = spark_path(site)
    pypath.write_record(site / "pyspark")
    worker = site / "pyspark" / "worker.py"
    worker.write_text("# another version's worker, as pyspark-client installs it\n")
    os.utime(worker, ns=(1, 1))
    assert pypath.zips_of_installed_pyspark(path) == []  # the record is void: the files moved on
    record = pypath.write_record(site / "pyspark")
    assert not record["same"]
    assert record["differing"] == ["pyspark/worker.py"]
    assert pypath.zips_of_installed_pyspark(path) == []


def test_a_missing_module_is_a_difference(site: Path) -> None:
    (site / "pyspark" / "extra.py").unlink()
    record = pypath.write_record(site / "pyspark")
    assert not record["same"]
    assert record["differing"] == ["pyspark/extra.py (missing)"]


def test_another_spark_home_keeps_its_zip(site: Path, tmp_path: Path) -> None:
    pypath.write_record(site / "pyspark")
    other = tmp_path / "spark-4.3.0-bin" / "python" / "lib" / "pyspark.zip"  # a distribution's, not the package's
    assert pypath.zips_of_installed_pyspark([str(other), str(site)]) == []


def test_prefer_installed_pyspark(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pypath.write_record(site / "pyspark")
    path = spark_path(site)
    monkeypatch.setattr(sys, "path", list(path))
    monkeypatch.setitem(sys.modules, "pyspark", sys.modules.get("pyspark", object()))  # type: ignore[arg-type]
    assert pypath.prefer_installed_pyspark() == []
    assert sys.path == path
    monkeypatch.delitem(sys.modules, "pyspark")
    assert pypath.prefer_installed_pyspark() == path[:2]
    assert sys.path == path[2:]


def test_py4j_of_another_version_keeps_its_zip(site: Path) -> None:
    pypath.write_record(site / "pyspark")
    (site / "py4j-0.10.9.9.dist-info").rename(site / "py4j-0.10.9.8.dist-info")
    path = spark_path(site)
    assert pypath.zips_of_installed_pyspark(path) == path[:1]  # pyspark's zip goes, py4j's stays


def test_another_pyspark_first_on_the_path_keeps_the_zip(site: Path, tmp_path: Path) -> None:
    pypath.write_record(site / "pyspark")
    other = tmp_path / "other-site" / "pyspark"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("# another pyspark, earlier on the path than the recorded one\n")
    path = spark_path(site)
    assert pypath.zips_of_installed_pyspark([*path[:3], str(other.parent), *path[3:]]) == []


def test_a_replaced_file_of_the_same_size_and_time_is_seen(site: Path) -> None:
    pypath.write_record(site / "pyspark")
    version = site / "pyspark" / "version.py"
    st = version.stat()
    new = version.with_name("version.py.new")  # an install over it writes a new file (or links its cache's) and
    new.write_text("# " + "x" * (st.st_size - 3) + "\n")  # renames it over the old: a new inode
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    new.replace(version)
    assert version.stat().st_size == st.st_size
    assert pypath.zips_of_installed_pyspark(spark_path(site)) == []


def test_errors_keep_the_zips(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pypath.write_record(site / "pyspark")
    path = spark_path(site)
    monkeypatch.setattr(sys, "path", list(path))
    monkeypatch.delitem(sys.modules, "pyspark", raising=False)

    def broken(_: list[str]) -> list[str]:
        raise RuntimeError("Symlink loop from '/x'")

    monkeypatch.setattr(pypath, "zips_of_installed_pyspark", broken)
    assert pypath.prefer_installed_pyspark() == []
    assert sys.path == path


def test_data_files_are_compared(site: Path) -> None:
    lib = site / "pyspark" / "python" / "lib"
    with zipfile.ZipFile(lib / "pyspark.zip", "a") as zipped:
        zipped.writestr("pyspark/errors/error-conditions.json", '{"A": 1}')
        zipped.writestr("pyspark/sql/srs_registry.csv", "not in the wheel, read by no module\n")
    (site / "pyspark" / "errors").mkdir()
    (site / "pyspark" / "errors" / "error-conditions.json").write_text('{"A": 2}')
    record = pypath.write_record(site / "pyspark")
    assert record["differing"] == ["pyspark/errors/error-conditions.json"]


def test_jobs_import_no_pyspark_before_main() -> None:
    """Each job drops the zips in __main__, after its own imports: those must not import PySpark."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    for job in sorted((root / "jobs").glob("[a-z]*.py")):
        code = f"import runpy, sys; runpy.run_path({str(job)!r}, run_name='job'); print('pyspark' in sys.modules)"
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.strip() == "False", f"{job.name} imports pyspark at import time"


def test_the_folder_of_imgest_spark_install_replaces_the_zips(tmp_path: Path) -> None:
    """A Spark `imgest spark install` put beside the environment (pyspark and py4j in a folder of their own, its
    record beside them, READY last): its zips give way to that folder, ahead of the environment's pyspark-client
    files; not before READY, nor once a file changed."""
    dist = tmp_path / "share" / "imgest" / "spark" / "pyspark-4.3.0"
    _spark_package(dist)
    client = tmp_path / "site-packages" / "pyspark"  # pyspark-client's files, another version
    client.mkdir(parents=True)
    (client / "__init__.py").write_text("# pyspark-client\n")
    lib = dist / "pyspark" / "python" / "lib"
    path = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip"), "/jobs", str(client.parent)]
    assert pypath.write_record(dist / "pyspark")["same"]
    assert pypath.record_path(dist / "pyspark") == dist / pypath.RECORD  # beside it, not in sys.prefix
    assert pypath.settled_path(path) == path  # no READY: the install did not finish
    (dist / pypath.READY).write_text("4.3.0\n")
    assert pypath.settled_path(path) == [str(dist), "/jobs", str(client.parent)]
    (dist / "pyspark" / "worker.py").unlink()
    (dist / "pyspark" / "worker.py").write_text("# another version's worker\n")
    assert pypath.settled_path(path) == path  # the record is void: Spark's zips stay
