"""What the packaging tests share: the wheels, built once per session from this checkout (the plain one for this
interpreter, and a manylinux one per other CPython: scripts/build_wheels.sh), and a PATH without build tools."""

from __future__ import annotations

import re
import shutil
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


@pytest.fixture(scope="session")
def manylinux_wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The manylinux wheel of each other CPython the legs run (scripts/build_wheels.sh), by version."""
    if ROOT is None:
        pytest.skip("needs a source checkout")
    out = tmp_path_factory.mktemp("manylinux")
    _run("bash", ROOT / "scripts" / "build_wheels.sh", out, "3.12", cwd=ROOT)
    return {"3.12": next(out.glob("imgest-*-cp312-cp312-manylinux*.whl"))}


def interpreter(version: str) -> str:
    """This machine's CPython VERSION (pyenv's, else pythonX.Y on PATH): what scripts/build_wheels.sh finds too."""
    if sys.version.startswith(version + "."):
        return sys.executable
    pyenv = shutil.which("pyenv")
    if pyenv:
        prefix = subprocess.run([pyenv, "prefix", version], capture_output=True, text=True, check=False).stdout.strip()
        if prefix and Path(prefix, "bin", f"python{version}").is_file():
            return str(Path(prefix, "bin", f"python{version}"))
    found = shutil.which(f"python{version}")
    assert found, f"no CPython {version} on this machine (pyenv install {version})"
    return found


# What a worker image without build tools lacks: a JDK's compiler, Maven, a C compiler and its binutils (the wheel's
# prebuilt helper.jar and compiled JPEG module, and the helper's locked jars fetched with no Maven, are tested so).
BUILD_TOOLS = re.compile(  # ld and ld.bfd / ld.gold, not ldd or ldconfig
    r"(javac|jar|javadoc|mvn|mvnDebug|gcc.*|g\+\+.*|cc|c\+\+|c89|c99|cpp.*|clang.*|ld|ld\.\w+|as|make)"
)


def path_without_build_tools(folder: Path) -> str:
    """FOLDER of links to every program of /usr/local/bin, /usr/bin and /bin but BUILD_TOOLS (by name, their
    x86_64-linux-gnu- forms included)."""
    folder.mkdir(parents=True, exist_ok=True)
    for source in (Path("/usr/local/bin"), Path("/usr/bin"), Path("/bin")):
        for program in sorted(source.iterdir()) if source.is_dir() else []:
            name = program.name.removeprefix("x86_64-linux-gnu-")
            if not BUILD_TOOLS.fullmatch(name) and not (folder / program.name).exists():
                (folder / program.name).symlink_to(program)
    return str(folder)
