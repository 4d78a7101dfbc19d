"""The executors' Python, shipped with each job through Spark's own mechanism (``spark.archives``).

With ``$IMGEST_SPARK_PYENV=ship`` (or the path of an archive built before), a job on a cluster sends a packed
virtual environment with the submission: Spark unpacks it into each executor's working folder as
``./imgest-env`` and runs the Python workers with ``./imgest-env/bin/python`` (``spark.pyspark.python``; the
driver keeps this Python). An executor machine then needs only Java and a bare Python of the same minor version
(``3.11``) at the path the archive links to: this Python's base interpreter, or ``$IMGEST_EXECUTOR_PYTHON``
(e.g. ``/usr/bin/python3.11``). Spark's "Python Package Management" page describes the mechanism.

The environment holds what executors import and nothing else: imgest itself (built from this checkout, with
its compiled JPEG module) and the libraries of the transform and the stores (Pillow, NumPy, PyArrow, the
Cassandra driver, boto3), at the versions installed here. About 290 MB unpacked, 105 MB packed, built in
about 10 s with uv and cached under ``$IMGEST_HOME/spark/`` by content (code, versions, interpreter).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from imgest.core.errors import ConfigError
from imgest.core.paths import PACKAGE_DIR, repo_root, state_dir

log = logging.getLogger(__name__)
SETTING = "IMGEST_SPARK_PYENV"
PYTHON_SETTING = "IMGEST_EXECUTOR_PYTHON"
FOLDER = "imgest-env"  # where Spark unpacks the archive in each executor's working folder
EXECUTOR_PACKAGES = (
    "pillow",
    "numpy",
    "pyarrow",
    "cassandra-driver",
    "geomet",
    "click",
    "boto3",
    "botocore",
    "s3transfer",
    "jmespath",
    "urllib3",
    "python-dateutil",
    "six",
)


def executor_conf() -> dict[str, str]:
    """Spark settings that ship the executors' environment, or {} when ``$IMGEST_SPARK_PYENV`` is unset."""
    setting = os.environ.get(SETTING, "").strip()
    if not setting or setting == "off":
        return {}
    archive = build_archive() if setting == "ship" else Path(setting).expanduser().resolve()
    if not archive.is_file():
        raise ConfigError(f"{SETTING}={setting!r}: no such archive (use 'ship' to build one from this install)")
    return {"spark.archives": f"{archive}#{FOLDER}", "spark.pyspark.python": f"./{FOLDER}/bin/python"}


def base_python() -> Path:
    """The interpreter the environment's python links to on executors."""
    configured = os.environ.get(PYTHON_SETTING, "").strip()
    return Path(configured) if configured else Path(os.path.realpath(sys._base_executable))  # type: ignore[attr-defined]


def pins() -> list[str]:
    """EXECUTOR_PACKAGES at the versions installed here (the driver's)."""
    return [f"{name}=={importlib.metadata.version(name)}" for name in EXECUTOR_PACKAGES]


def _code_digest() -> str:
    h = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(PACKAGE_DIR)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def build_archive() -> Path:
    """The packed environment for this code and these versions (built once, then reused)."""
    root = repo_root()
    if root is None:
        raise ConfigError(f"{SETTING}=ship builds the environment from a checkout; pass the path of a packed one")
    key = hashlib.sha256("\n".join([_code_digest(), *pins(), str(base_python())]).encode()).hexdigest()[:16]
    out = state_dir() / "spark" / f"executor-env-{key}.tar.gz"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    build = out.with_name(f".build-{os.getpid()}")
    shutil.rmtree(build, ignore_errors=True)
    try:
        _install(build / "env", root)
        _pack(build / "env", out)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    log.info("executors' environment packed: %s (%.0f MB)", out, out.stat().st_size / 1e6)
    return out


def _install(env: Path, root: Path) -> None:
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        raise ConfigError("building the executors' environment needs uv (installed with imgest)")
    python = str(base_python())
    steps = [
        [uv, "venv", "-q", "--python", python, str(env)],
        [uv, "pip", "install", "-q", "--python", str(env / "bin" / "python"), *pins()],
        [uv, "pip", "install", "-q", "--python", str(env / "bin" / "python"), "--no-deps", str(root)],
    ]
    for cmd in steps:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ConfigError(f"building the executors' environment failed: {' '.join(cmd)}\n{done.stderr[-2000:]}")


def _pack(env: Path, out: Path) -> None:
    """ENV as a .tar.gz whose members are relative to it (Spark unpacks it into FOLDER); links kept as links."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    with tarfile.open(tmp, "w:gz", compresslevel=1) as tar:
        for path in sorted(env.rglob("*")):
            if "__pycache__" in path.parts:
                continue
            tar.add(path, arcname=str(path.relative_to(env)), recursive=False)
    tmp.replace(out)
