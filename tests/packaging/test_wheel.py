"""The built wheel holds only the imgest name, the CQL, the DAGs and the compiled JPEG module."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from imgest.core.paths import repo_root

pytestmark = pytest.mark.slow
ROOT = repo_root()


def test_wheel_installs_no_generic_top_level_names(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        tops = {name.split("/", 1)[0] for name in zf.namelist()}
        names = set(zf.namelist())
    assert {t for t in tops if not t.endswith(".dist-info")} == {"imgest"}
    assert "imgest/sql/data_table.cql" in names
    assert "imgest/dags/ingest_imagenet.py" in names
    assert "imgest/jobs/pack_shards.py" in names
    assert "imgest/operators/hooks.py" in names
    assert any(n.startswith("imgest/transform/_fastjpeg.") and n.endswith(".so") for n in names)  # compiled
    assert not any(n.startswith("imgest/transform/_fastjpeg_testing") for n in names)  # test hooks stay out
