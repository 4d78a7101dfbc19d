"""Where imgest keeps its files: the shipped folders (jobs, DAGs, CQL, service configs) and the state folder.

The top-level ``dags/``, ``operators/``, ``jobs/`` and ``sql/`` folders of a checkout are installed as the
packages ``imgest.dags``, ``imgest.operators``, ``imgest.jobs`` and ``imgest.sql`` (see setup.py), so the
same lookups work from a checkout (editable install) and from a wheel.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent


def shipped_dir(package: str) -> Path:
    """The folder of the shipped package imgest.PACKAGE (dags, jobs, operators, sql)."""
    spec = importlib.util.find_spec(f"imgest.{package}")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"imgest.{package} is not installed: reinstall imgest (pip install -e . or the wheel)")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def repo_root() -> Path | None:
    """The checkout that holds this package (with pyproject.toml), or None for a wheel install."""
    root = PACKAGE_DIR.parent
    return root if (root / "pyproject.toml").is_file() and (root / "dags").is_dir() else None


def state_path() -> Path:
    """Where state_dir() is, made or not: what a reader of one file there (the datasets file at DAG parse time)
    uses, so that it writes nothing (a worker image's home may be read-only)."""
    env = os.environ.get("IMGEST_HOME")
    if env:
        return Path(env).expanduser()
    root = repo_root()
    return root / ".imgest" if root else Path.home() / ".imgest"


def state_dir() -> Path:
    """Folder for jars, service data, logs, PID files, work folders and AIRFLOW_HOME (made, private).

    ``$IMGEST_HOME`` when set; otherwise ``.imgest/`` in the checkout (git-ignored), or ``~/.imgest``.
    """
    path = state_path()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    private(path)
    return path.resolve()


def private(path: Path) -> None:
    """Make PATH readable by its owner only (0700 folders, 0600 files); left alone if someone else owns it."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return
    mode = 0o700 if path.is_dir() else 0o600
    if st.st_uid == os.getuid() and st.st_mode & 0o777 != mode:
        path.chmod(mode)


def conf_file(name: str) -> Path:
    """A configuration file shipped with the package (services/conf/NAME)."""
    return PACKAGE_DIR / "services" / "conf" / name


def dags_dir() -> Path:
    """The folder Airflow loads imgest's DAGs from."""
    return shipped_dir("dags")


def jobs_dir() -> Path:
    """The folder of the Spark entry points."""
    return shipped_dir("jobs")


def sql_dir() -> Path:
    """The folder of the CQL schema files."""
    return shipped_dir("sql")
