"""PySpark imported from the installed package, not from Spark's source zip, where both hold the same files.

spark-submit puts ``$SPARK_HOME/python/lib/pyspark.zip`` and the py4j source zip first on the ``PYTHONPATH`` of the
driver and of every Python worker. The zips hold sources only, and Python cannot cache bytecode inside a zip, so
every driver and every executor's worker daemon compiles PySpark again: 0.66-0.75 s against 0.14 s from the
installed package's bytecode on this project's 2-core machine, and 1.5 s in a driver whose other thread imports
at the same time.

Where ``SPARK_HOME`` is the pip-installed ``pyspark`` package itself (a local master with this project's Spark),
the zip is a copy of a package that is on ``sys.path`` anyway, if the package's files are the zip's: pip packages
that ship PySpark's Python alone (``pyspark-client``, which Airflow's Spark provider requires) install over the same
files, at their own version. So the install compares them once (``python -m imgest.spark.pypath``: every file of
the zip against the package) and records the verdict in ``sys.prefix`` with the identity (inode, size, time) of the
zip, of a few key modules and of pyspark's installed-files list; at run time ``prefer_installed_pyspark`` drops the
zips only where that record says "same", none of those changed, and the first ``pyspark`` the rest of the path
imports is that package. Anything else (no record, an install over the package, a Spark distribution of its own as
on a user's cluster, any error) keeps Spark's zips, as spark-submit set them.

A Spark that ``imgest spark install`` put beside the environment (imgest.spark.distribution: pyspark and py4j in a
folder of their own, never over pyspark-client's files) is compared and recorded the same way when installed, the
record beside it; where it says "same", the zips give way to that folder, which holds both compiled.

Drivers call it before their first PySpark import (each job under jobs/, in ``__main__``; none of their modules
imports PySpark at import time); a local master's workers get it through ``DAEMON_MODULE``, the Python worker
daemon Spark starts (``spark.python.daemon.module``), which then runs PySpark's own daemon.
"""

from __future__ import annotations

import json
import sys
import uuid
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

DAEMON_MODULE = "imgest.spark.worker_daemon"
RECORD = ".imgest-pyspark-zip.json"
READY = ".imgest-spark-ready"  # the last file of a completed `imgest spark install` (imgest.spark.distribution)
# What a reinstall of either package rewrites (each a new file: a new inode): the record is void once one changes.
WATCHED = ("__init__.py", "version.py", "serializers.py", "daemon.py", "worker.py", "worker_util.py")
# Members of the zip the wheel leaves out, never imported by a job; and typing-only files.
UNSHIPPED = ("/tests/", "/benchmark/")
UNCOMPARED = (".pyi", "/py.typed")


def record_path(package: Path | None = None) -> Path:
    """Where the verdict on PACKAGE is recorded: beside it in a Spark install of imgest's (a folder with READY or
    being made one), else in sys.prefix (a pyspark installed into the environment)."""
    if package is not None and package.parent.name.startswith(("pyspark-", ".pyspark-")):
        return package.parent / RECORD
    return Path(sys.prefix) / RECORD


def signature(package: Path) -> dict[str, list[int] | None]:
    """Inode, size and modification time of PACKAGE's zip, its WATCHED files and the installed-files lists of the
    packages that install PySpark's files (pyspark's, pyspark-client's); None: not there."""
    names = ["python/lib/pyspark.zip", *WATCHED]
    names += sorted(f"../{d.name}/RECORD" for d in package.parent.glob("pyspark*.dist-info"))
    out: dict[str, list[int] | None] = {}
    for name in names:
        try:
            st = (package / name).stat()
        except OSError:
            out[name] = None
            continue
        out[name] = [st.st_ino, st.st_size, st.st_mtime_ns]
    return out


def differing(package: Path) -> list[str]:
    """The files of PACKAGE's pyspark.zip (modules and data, typing stubs apart) that the installed package
    (PACKAGE's parent) holds with other bytes, and its modules that the package lacks (but for UNSHIPPED ones)."""
    import zipfile
    import zlib

    out = []
    with zipfile.ZipFile(package / "python" / "lib" / "pyspark.zip") as zipped:
        for info in zipped.infolist():
            if info.is_dir() or info.filename.endswith(UNCOMPARED):
                continue
            try:
                crc = zlib.crc32((package.parent / info.filename).read_bytes())
            except OSError:  # the wheel leaves out tests, benchmarks and some data no module reads
                if info.filename.endswith(".py") and not any(part in info.filename for part in UNSHIPPED):
                    out.append(f"{info.filename} (missing)")
                continue
            if crc != info.CRC:
                out.append(info.filename)
    return out


def write_record(package: Path) -> dict[str, Any]:
    """Compare PACKAGE (the importable pyspark folder) with its zip; record the verdict in sys.prefix."""
    package = package.resolve()
    found = differing(package)
    record = {"package": str(package), "same": not found, "differing": found[:5], "signature": signature(package)}
    # a name of its own: two installs (processes, threads, hosts over one shared prefix) never write one file
    tmp = record_path(package).with_suffix(f".{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_text(json.dumps(record, indent=1))
        tmp.replace(record_path(package))
    finally:
        tmp.unlink(missing_ok=True)
    return record


def recorded_same(package: Path) -> bool:
    """True when the install recorded PACKAGE's files as its zip's and they have not changed since."""
    try:
        record = json.loads(record_path(package).read_text())
        return bool(record["same"]) and record["package"] == str(package) and record["signature"] == signature(package)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def zips_of_installed_pyspark(path: list[str]) -> list[str]:
    """The entries of PATH (a sys.path) that are Spark's pyspark and py4j source zips of a pyspark package that a
    later entry of PATH imports, with the same files (recorded_same): ``<entry>/pyspark/python/lib/pyspark.zip``,
    and the py4j zip beside it when the py4j that the rest of PATH imports comes from a dist of the zip's version
    in the same folder."""
    dropped: list[str] = []
    for i, entry in enumerate(path):
        if not entry.endswith("pyspark.zip"):
            continue
        lib = Path(entry).parent
        package = lib.parent.parent.resolve()  # <pkg>/python/lib/pyspark.zip
        rest = [p for p in path[i + 1 :] if p and not p.endswith(".zip")]
        if package.name != "pyspark" or _imported_from(rest, "pyspark") != package or not recorded_same(package):
            continue
        dropped.append(entry)
        for other in path:
            name = Path(other).name
            if Path(other).parent == lib and name.startswith("py4j-") and name.endswith("-src.zip"):
                version = name.removeprefix("py4j-").removesuffix("-src.zip")
                py4j = _imported_from(rest, "py4j")
                if py4j is not None and (py4j.parent / f"py4j-{version}.dist-info").is_dir():
                    dropped.append(other)
    return dropped


def settled_path(path: list[str]) -> list[str]:
    """PATH (a sys.path) with Spark's source zips replaced where a package with the same files and bytecode is at
    hand: the zips of a Spark that `imgest spark install` put in place (READY beside its pyspark, recorded the
    same) by that folder, which holds pyspark and py4j compiled; those of a pyspark the rest of PATH imports
    (zips_of_installed_pyspark) dropped."""
    out: list[str] = []
    skip: set[str] = set()
    for entry in path:
        if entry in skip:
            continue
        package = Path(entry).parent.parent.parent.resolve() if entry.endswith("pyspark.zip") else None
        if package is None or package.name != "pyspark" or not (package.parent / READY).is_file():
            out.append(entry)
            continue
        if not recorded_same(package):
            out.append(entry)
            continue
        out.append(str(package.parent))
        lib = Path(entry).parent
        for other in path:  # py4j's zip too, where the install holds that version's py4j
            name = Path(other).name
            if Path(other).parent == lib and name.startswith("py4j-") and name.endswith("-src.zip"):
                version = name.removeprefix("py4j-").removesuffix("-src.zip")
                if (package.parent / f"py4j-{version}.dist-info").is_dir():
                    skip.add(other)
    dropped = set(zips_of_installed_pyspark(out))
    return [p for p in out if p not in dropped]


def _imported_from(path: list[str], name: str) -> Path | None:
    """The folder of package NAME as PATH would import it (resolved), or None."""
    spec = PathFinder.find_spec(name, path)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).resolve().parent


def prefer_installed_pyspark() -> list[str]:
    """Drop from sys.path Spark's source zips of the pyspark package installed later on it (see the module's
    note), unless pyspark is imported already; returns what was dropped. Never raises: on any error the zips stay
    (a worker daemon that failed here would fail every task)."""
    if "pyspark" in sys.modules:
        return []
    try:
        settled = settled_path(sys.path)
    except Exception:  # the zips are always a working path
        return []
    dropped = [p for p in sys.path if p not in settled]
    sys.path[:] = settled
    return dropped


def main() -> int:
    """The install's step: record whether the installed pyspark's files are its zip's."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        print("imgest install: no pyspark to compare with its zip", file=sys.stderr)
        return 1
    import zipfile

    try:
        record = write_record(Path(spec.origin).parent)
    except (OSError, zipfile.BadZipFile) as exc:
        print(
            f"imgest install: pyspark not compared with its zip ({exc}); Spark's Python compiles it",
            file=sys.stderr,
        )
        return 1
    if record["same"]:
        print(f"imgest install: pyspark's source zip matches the package; Spark's Python imports bytecode ({RECORD})")
    else:
        print(
            f"imgest install: pyspark's files differ from its zip ({', '.join(record['differing'])}); Spark's Python "
            "compiles the zip at every start",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
