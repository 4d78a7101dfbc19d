"""validate.cache: a file's pages leave the page cache (measured with util-linux's fincore, as a user would)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from imgest.validate.cache import evict


def resident_bytes(path: Path) -> int | None:
    """Bytes of PATH in the page cache (util-linux's ``fincore``), or None where fincore is not installed."""
    tool = shutil.which("fincore")
    if tool is None:
        return None
    out = subprocess.run(
        [tool, "--bytes", "--noheadings", "--output", "RES", str(path)], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip() or 0)


def test_evicted_files_are_no_longer_cached(tmp_path: Path) -> None:
    paths = [tmp_path / f"f{i}.bin" for i in range(3)]
    for path in paths:
        path.write_bytes(os.urandom(2**20))  # written pages: dirty until written back, then dropped too
        assert path.read_bytes()
    before = [resident_bytes(p) for p in paths]
    if None in before:
        pytest.skip("fincore (util-linux) is not installed")
    assert all(b and b > 0 for b in before), before
    assert evict(paths[:2]) == 2
    assert [resident_bytes(p) for p in paths[:2]] == [0, 0]
    assert resident_bytes(paths[2]) == before[2]  # only the files named


def test_a_missing_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nothing\.bin"):
        evict([tmp_path / "nothing.bin"])
