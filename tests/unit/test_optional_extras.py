"""imgest without its optional extras (issue #52): DALI (imgest[dali]) and matplotlib (imgest[plots]) missing.

"Not installed" is real to the code under test: a finder first on sys.meta_path makes every import of the blocked
packages fail with ModuleNotFoundError, and the modules already imported are out of sys.modules while it is there
(both restored afterwards). The read-back step and the xNVMe validation then run over a real generated files
dataset (and shards packed into a folder), reading and hashing every stored byte.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from imgest.core.report import optional_plot, plots_missing, pyplot
from imgest.readback.check import ReadCheckOptions
from imgest.readback.pipelines import dali_available, dali_missing
from imgest.readback.step import read_throughput_step
from imgest.sinks.files.sample import write_files_dataset

NO_DALI = "DALI is not installed (pip install 'imgest[dali]')"
NO_PLOTS = "matplotlib is not installed (pip install 'imgest[plots]')"
OPTS = ReadCheckOptions(sample=0, batch_size=5, num_threads=1)  # 18 train images: batches of 5, 5, 5, 3


class _Blocker(importlib.abc.MetaPathFinder):
    """Every import of a module under PACKAGES fails as for a package that is not installed."""

    def __init__(self, packages: tuple[str, ...]) -> None:
        self.packages = packages

    def blocks(self, name: str) -> bool:
        return any(name == p or name.startswith(f"{p}.") for p in self.packages)

    def find_spec(self, name: str, path: Any = None, target: ModuleType | None = None) -> None:
        if self.blocks(name):
            raise ModuleNotFoundError(f"No module named {name!r} (not installed, for this test)", name=name)
        return None


@contextmanager
def not_installed(*packages: str) -> Iterator[None]:
    """PACKAGES (and their submodules) cannot be imported inside the block; sys.modules is restored after it."""
    blocker = _Blocker(packages)
    saved = {name: mod for name, mod in sys.modules.items() if blocker.blocks(name)}
    for name in saved:
        del sys.modules[name]
    sys.meta_path.insert(0, blocker)
    try:
        yield
    finally:
        sys.meta_path.remove(blocker)
        for name in [n for n in sys.modules if blocker.blocks(n)]:
            del sys.modules[name]
        sys.modules.update(saved)


@pytest.fixture
def no_extras() -> Iterator[None]:
    """Neither DALI nor matplotlib importable."""
    with not_installed("nvidia.dali", "matplotlib"):
        yield


@pytest.fixture(scope="module")
def files_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A published files dataset: 3 classes x 6 train and 2 val images (real JPEGs, sha256 recorded)."""
    root = tmp_path_factory.mktemp("extras") / "files"
    counts = write_files_dataset(root, classes=3, per_class=6, val_per_class=2, seed=3, large_every=0)
    assert counts == {"train": 18, "val": 6}
    return root


def test_dali_probe_follows_what_can_be_imported() -> None:
    assert importlib.util.find_spec("nvidia.dali") is not None  # this venv has imgest[dali]
    assert dali_available()
    assert dali_missing() is None
    with not_installed("nvidia.dali"):
        assert not dali_available()
        assert dali_missing() == NO_DALI
        with pytest.raises(ModuleNotFoundError):
            import nvidia.dali  # noqa: F401
    assert dali_available()  # restored
    assert "nvidia.dali" in sys.modules


def test_no_plot_without_matplotlib(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    drawn: list[Path] = []
    stale = tmp_path / "old.png"
    stale.write_bytes(b"a plot of an earlier report")
    with not_installed("matplotlib"), caplog.at_level(logging.WARNING, "imgest.core.report"):
        assert plots_missing() == NO_PLOTS
        assert optional_plot(stale, drawn.append) is None
        with pytest.raises(ModuleNotFoundError, match=r"imgest\[plots\]"):
            pyplot()
    assert drawn == []
    assert not stale.exists()  # it would not show this report
    assert [r.getMessage() for r in caplog.records] == [f"no plot: {NO_PLOTS}"]
    assert plots_missing() is None
    assert optional_plot(tmp_path / "new.png", drawn.append) == tmp_path / "new.png"
    assert drawn == [tmp_path / "new.png"]


def _manifest_check(root: Path) -> str:
    return json.loads((root / "manifest.json").read_text())["checks"]["read_throughput"]


def test_files_read_back_without_dali_or_matplotlib_proves_every_byte(
    files_dataset: Path, tmp_path: Path, no_extras: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        out = read_throughput_step("files", str(files_dataset), tmp_path, {}, OPTS)
    report = json.loads((tmp_path / "read_throughput.json").read_text())
    assert out["readers"].keys() == {"files-stream/raw"}
    assert [(r["reader"], r["mode"], r["images"], r["ok"]) for r in report["readers"]] == [
        ("files-stream", "raw", 18, True)
    ]
    assert report["readers"][0]["problems"] == []
    assert report["readers"][0]["bytes"] == sum(p.stat().st_size for p in files_dataset.rglob("train/*/*.jpg"))
    assert report["readers"][0]["settings"]["pipeline"] == "host memory, no DALI (raw bytes only)"
    skipped = [f"files (raw): {NO_DALI}", f"files (train): {NO_DALI}", f"files-stream (train): {NO_DALI}"]
    assert out["skipped"] == report["skipped"] == skipped
    assert out["checked"] == report["checked"] == 18
    assert report["full_read"]
    assert out["plot"] is None
    assert not (tmp_path / "read_throughput.png").exists()
    assert _manifest_check(files_dataset) == str(tmp_path / "read_throughput.json")
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("without DALI" in m for m in warned) == 1
    assert warned.count(f"no plot: {NO_PLOTS}") == 1


def test_a_changed_file_fails_the_read_back_without_dali(files_dataset: Path, tmp_path: Path, no_extras: None) -> None:
    import shutil

    from imgest.readback.step import ReadBackError

    copy = tmp_path / "copy"
    shutil.copytree(files_dataset, copy)
    victim = sorted(copy.rglob("train/*/*.jpg"))[4]
    victim.write_bytes(victim.read_bytes()[:-1] + b"\0")
    with pytest.raises(ReadBackError, match=rf"files-stream/raw: {victim.stem}: sha256 "):
        read_throughput_step("files", str(copy), tmp_path / "out", {}, OPTS)


def test_shards_in_a_folder_read_back_without_dali(tmp_path: Path, no_extras: None) -> None:
    from imgest.sinks.shards.plan import ShardSpec
    from imgest.sinks.shards.store import LocalStore
    from imgest.sources.devdata.sample import SampleSpec, write_sample
    from imgest.sources.scan import scan_to_dir
    from imgest.transform.image import TransformSpec
    from tests.shard_fixtures import pack_in_process

    write_sample(tmp_path / "src", SampleSpec("imagefolder", classes=3, per_class=6, val_per_class=1, seed=5))
    scan_to_dir(tmp_path / "src", tmp_path / "m")
    dest = tmp_path / "shards"
    pack_in_process(tmp_path / "m", LocalStore(dest), TransformSpec(quality=90), ShardSpec(max_count=4, seed=1))
    out = read_throughput_step("shards", str(dest), tmp_path / "out", {}, OPTS)
    report = json.loads((tmp_path / "out" / "read_throughput.json").read_text())
    assert [(r["reader"], r["mode"], r["images"], r["ok"]) for r in report["readers"]] == [
        ("shards-folder-stream", "raw", 18, True)
    ]
    assert out["checked"] == 18
    assert out["skipped"] == [
        f"shards-folder (raw): {NO_DALI}",
        f"shards-folder (train): {NO_DALI}",
        f"shards-folder-stream (train): {NO_DALI}",
    ]
    assert out["plot"] is None


def test_with_dali_and_matplotlib_the_read_back_is_as_before(files_dataset: Path, tmp_path: Path) -> None:
    out = read_throughput_step("files", str(files_dataset), tmp_path, {}, OPTS)
    report = json.loads((tmp_path / "read_throughput.json").read_text())
    assert [(r["reader"], r["mode"], r["images"], r["ok"]) for r in report["readers"]] == [
        ("files", "raw", 18, True),
        ("files", "train", 18, True),
    ]
    assert out["skipped"] == []
    assert out["plot"] == str(tmp_path / "read_throughput.png")
    assert (tmp_path / "read_throughput.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("missing", [("nvidia.dali", "matplotlib"), ()], ids=["without-extras", "with-extras"])
def test_xnvme_validation_without_dali_compares_the_other_engines(
    files_dataset: Path, tmp_path: Path, missing: tuple[str, ...]
) -> None:
    from imgest.validate.check import CheckConfig
    from imgest.validate.step import validate_xnvme_step

    cfg = CheckConfig(batch_size=4, rounds=1, engines=("dali_file", "python_file"), sample=0)
    with not_installed(*missing):
        summary = validate_xnvme_step(files_dataset, tmp_path, config=cfg)
    report = json.loads((tmp_path / "validate_xnvme.json").read_text())
    assert summary["ok"]
    assert summary["checked"] == 24  # train and val, every image
    engines = {r["engine"]: r for r in report["engines"]}
    assert engines["python_file"]["status"] == "ok"
    assert engines["python_file"]["checked"] == 24  # each one's bytes hashed against its recorded sha256
    assert engines["python_file"]["mismatches"] == 0
    if missing:
        assert summary["skipped"] == {"dali_file": NO_DALI}
        assert engines["dali_file"]["status"] == "skipped"
        assert summary["plot"] is None
        assert not list(tmp_path.glob("*.png"))
    else:  # as before: DALI's file reader is the reference, the plot is drawn
        assert summary["skipped"] == {}
        assert (engines["dali_file"]["status"], engines["dali_file"]["checked"]) == ("ok", 24)
        assert summary["plot"] == str(tmp_path / "validate_xnvme.png")
        assert (tmp_path / "validate_xnvme.png").read_bytes().startswith(b"\x89PNG")


class _Broken:
    """A meta-path finder for which nvidia.dali is there but fails to import (a broken install)."""

    def find_spec(self, name: str, path: Any = None, target: ModuleType | None = None) -> None:
        if name == "nvidia.dali" or name.startswith("nvidia.dali."):
            raise ImportError("libcudart.so.13: cannot open shared object file (for this test)")
        return None


def test_a_broken_dali_fails_loudly_instead_of_being_skipped() -> None:
    from imgest.readback.pipelines import DaliMissingError, dali_missing

    saved = {n: m for n, m in sys.modules.items() if n == "nvidia.dali" or n.startswith("nvidia.dali.")}
    for name in saved:
        del sys.modules[name]
    finder = _Broken()
    sys.meta_path.insert(0, finder)
    try:
        with pytest.raises(DaliMissingError, match=r"installed but cannot be imported .*libcudart"):
            dali_missing()
    finally:
        sys.meta_path.remove(finder)
        sys.modules.update(saved)
    assert dali_missing() is None  # the real DALI of this environment again
