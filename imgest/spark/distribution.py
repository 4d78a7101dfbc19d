"""Spark itself (its jars, ``spark-submit``, the PySpark beside them), kept apart from the environment's packages.

Airflow's Spark provider requires ``pyspark-client``, Spark Connect's client: PySpark's Python files at its own
version. The ``pyspark`` package ships the same files (with Spark's jars and scripts) at another version; installed
into one environment, whichever comes second writes its files over the first's (pip says nothing), and uninstalling
either breaks the other. So imgest never installs pyspark among the environment's packages. Spark comes from, in
this order:

1. ``$SPARK_HOME``, a folder with ``bin/spark-submit``: the platform's own Spark (a cluster's image, an EMR node);
2. ``imgest spark install``: pyspark and py4j from the package index (or ``--find-links`` wheels) into
   ``<venv>/share/imgest/spark/pyspark-<version>/`` (the state folder where the environment is read-only), a folder
   no import path names, compiled to bytecode and compared with Spark's source zip (imgest.spark.pypath);
3. a ``pyspark`` installed into the environment by its owner (one with Spark's ``jars/``, not pyspark-client's files).

The Spark Connect route (an ``sc://`` master) needs none of them in the Airflow worker: its jobs run as Connect's thin
clients on pyspark-client.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from imgest.core.errors import ConfigError
from imgest.core.paths import state_dir
from imgest.spark.pypath import READY  # written last: a folder without it is an install that did not finish

PYSPARK_VERSION = "4.3.0"  # the Spark `imgest spark install` puts in place (requirements/spark.txt pins the same)
NOT_INSTALLED = (
    "no Spark here: set SPARK_HOME to a Spark 4 distribution (the platform's), or run `imgest spark install` once "
    "where imgest is installed (pyspark {version} beside the environment, never over its pyspark-client); an sc:// "
    "master (Spark Connect) needs neither"
)


def homes(version: str = PYSPARK_VERSION) -> list[Path]:
    """Where `imgest spark install` may have put VERSION, in order: beside the environment (an image's build), then
    the state folder (a host's own install where the environment is read-only)."""
    name = f"pyspark-{version}"
    return [Path(sys.prefix) / "share" / "imgest" / "spark" / name, state_dir() / "spark-dist" / name]


def installed(version: str | None = None) -> Path | None:
    """The folder `imgest spark install` completed for VERSION (it holds pyspark/ and py4j/), or None. No VERSION:
    PYSPARK_VERSION's, else the one another `--version` put in place (the highest where there are several)."""
    if version is not None:
        return next((home for home in homes(version) if (home / READY).is_file()), None)
    found = installed(PYSPARK_VERSION)
    if found is not None:
        return found
    others = [d for home in homes() for d in home.parent.glob("pyspark-*") if (d / READY).is_file()]
    return max(others, key=lambda d: _version_key(d.name.removeprefix("pyspark-")), default=None)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) if part.isdigit() else -1 for part in version.split("."))


def is_spark_home(path: Path) -> bool:
    return (path / "bin" / "spark-submit").is_file() and (path / "jars").is_dir()


def spark_home() -> Path | None:
    """Spark's folder (bin/spark-submit, jars/): $SPARK_HOME, imgest's install, or a pyspark installed into the
    environment; None: no Spark here. Found, never imported (importing pyspark costs the CLI 0.15 s)."""
    env = os.environ.get("SPARK_HOME")
    if env and is_spark_home(Path(env)):
        return Path(env).resolve()
    dist = installed()
    if dist is not None:
        return (dist / "pyspark").resolve()
    try:
        spec = importlib.util.find_spec("pyspark")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    home = Path(spec.origin).resolve().parent
    return home if is_spark_home(home) else None  # pyspark-client's files hold no Spark


def require_home() -> Path:
    """spark_home(), or ConfigError saying how to get one."""
    home = spark_home()
    if home is None:
        raise ConfigError(NOT_INSTALLED.format(version=PYSPARK_VERSION))
    return home


def spark_submit() -> str:
    """The spark-submit to run (ConfigError where there is no Spark)."""
    return str(require_home() / "bin" / "spark-submit")


def spark_env(env: dict[str, str]) -> dict[str, str]:
    """ENV with SPARK_HOME set to spark_home() and its bin/ first on PATH (where there is a Spark): spark-submit's
    scripts then never look for Spark through the Python on PATH, which may hold pyspark-client's files only."""
    home = spark_home()
    if home is None:
        return env
    path = env.get("PATH", "")
    return {**env, "SPARK_HOME": str(home), "PATH": str(home / "bin") + (os.pathsep + path if path else "")}


def python_path() -> list[str]:
    """What a Python process started without spark-submit (the test suite's reused driver) puts first on its path
    to import this Spark's own PySpark, not pyspark-client's files: imgest's install folder (pyspark and py4j,
    compiled), or Spark's source zips as spark-submit gives them; nothing for a pyspark of this environment."""
    home = spark_home()
    if home is None:
        return []
    if (home.parent / READY).is_file():
        return [str(home.parent)]
    spec = importlib.util.find_spec("pyspark")
    if spec is not None and spec.origin is not None and Path(spec.origin).resolve().parent == home:
        return []  # this environment's pyspark is Spark's
    lib = home / "python" / "lib"
    if not (lib / "pyspark.zip").is_file():
        return []
    return [str(lib / "pyspark.zip"), *sorted(str(z) for z in lib.glob("py4j-*-src.zip"))]


def _installer(target: Path, requirement: str, find_links: Sequence[str], index_url: str | None) -> list[str]:
    """The command that installs REQUIREMENT (with its dependencies) into TARGET: uv where it is beside this Python
    or on PATH, else pip."""
    uv = Path(sys.executable).parent / "uv"
    found = str(uv) if uv.is_file() else shutil.which("uv")
    links = [arg for link in find_links for arg in ("--find-links", link)]
    index = ["--index-url", index_url] if index_url else []
    if found:
        return [found, "pip", "install", "-q", "--python", sys.executable, "--target", str(target), *links, *index,
                requirement]  # fmt: skip
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile"]
    return [*pip, "--target", str(target), *links, *index, requirement]


def _writable(candidates: list[Path]) -> Path:
    for home in candidates:
        try:
            home.parent.mkdir(parents=True, exist_ok=True)
            if os.access(home.parent, os.W_OK):
                return home
        except OSError:
            continue
    raise ConfigError(f"imgest spark install: none of {', '.join(str(h.parent) for h in candidates)} is writable")


def install(
    version: str = PYSPARK_VERSION,
    find_links: Sequence[str] = (),
    index_url: str | None = None,
    progress: Callable[[str], None] = print,
) -> Path:
    """pyspark VERSION and py4j into the first writable of homes(VERSION), unless there already; returns the folder.
    Built in a scratch folder and renamed into place, READY written last: a failed install leaves nothing."""
    done = installed(version)
    if done is not None:
        progress(f"Spark {version} is installed in {done}")
        return done
    home = _writable(homes(version))
    scratch = home.with_name(f".{home.name}.{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.rmtree(home, ignore_errors=True)  # an install that never finished
    progress(f"installing pyspark {version} into {home}")
    cmd = _installer(scratch, f"pyspark=={version}", find_links, index_url)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not is_spark_home(scratch / "pyspark"):
        shutil.rmtree(scratch, ignore_errors=True)
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise ConfigError(f"imgest spark install: pyspark {version} did not install: {' / '.join(tail)}")
    # bytecode, so that Spark's Python imports it instead of compiling Spark's source zip at each start
    compile_all = [sys.executable, "-m", "compileall", "-q", "-j", "0", str(scratch)]
    subprocess.run(compile_all, capture_output=True, check=False)
    scratch.rename(home)
    _record(home / "pyspark", progress)
    (home / READY).write_text(version + "\n")
    progress(f"Spark {version} installed in {home} (SPARK_HOME {home / 'pyspark'})")
    return home


def _record(package: Path, progress: Callable[[str], None]) -> None:
    """Whether PACKAGE's files are its source zip's (imgest.spark.pypath), recorded beside it."""
    import zipfile

    from imgest.spark.pypath import write_record

    try:
        record = write_record(package)
    except (OSError, zipfile.BadZipFile) as exc:
        progress(f"pyspark not compared with its zip ({exc}): Spark's Python compiles the zip at every start")
        return
    if not record["same"]:
        progress(f"pyspark's files differ from its zip ({', '.join(record['differing'])}): Spark's Python compiles it")
