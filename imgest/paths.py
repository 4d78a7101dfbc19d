"""Where imgest keeps its files: the repository checkout and the ignored state folder."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def repo_root() -> Path | None:
    """The checkout that holds this package (with dags/ and sql/), or None for a wheel install."""
    root = PACKAGE_DIR.parent
    return root if (root / "pyproject.toml").is_file() and (root / "dags").is_dir() else None


def state_dir() -> Path:
    """Folder for jars, service data, logs, PID files and AIRFLOW_HOME.

    ``$IMGEST_HOME`` when set; otherwise ``.imgest/`` in the checkout (git-ignored), or ``~/.imgest``.
    """
    env = os.environ.get("IMGEST_HOME")
    if env:
        path = Path(env).expanduser()
    else:
        root = repo_root()
        path = root / ".imgest" if root else Path.home() / ".imgest"
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()


def conf_file(name: str) -> Path:
    """A configuration file shipped with the package (services/conf/NAME)."""
    return PACKAGE_DIR / "services" / "conf" / name


def dags_dir() -> Path:
    """The folder Airflow loads DAGs from."""
    root = repo_root()
    if root is None:
        raise FileNotFoundError("dags/ is only available from a source checkout of imgest")
    return root / "dags"
