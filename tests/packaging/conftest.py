"""What the packaging tests share: the wheel, built once per session from this checkout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from imgest.core.paths import repo_root

ROOT = repo_root()


def _run(*cmd: str | Path, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True, **kw)  # type: ignore[call-overload]


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if ROOT is None:
        pytest.skip("needs a source checkout")
    out = tmp_path_factory.mktemp("dist")
    uv = Path(sys.executable).parent / "uv"
    # sdist first, then the wheel from it (uv's default): what a release builds, and no stale ./build in the wheel
    _run(uv, "build", "--out-dir", out, ROOT, cwd=ROOT)
    return next(out.glob("imgest-*.whl"))
