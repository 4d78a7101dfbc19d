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


def test_wheel_states_its_license_and_that_it_is_an_airflow_provider(wheel: Path) -> None:
    """An SPDX license expression with the LICENSE file inside, and the classifier platforms search providers by."""
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = zf.read(meta_name).decode().splitlines()
        license_text = zf.read(meta_name.replace("METADATA", "licenses/LICENSE")).decode()
    assert "License-Expression: Apache-2.0" in meta
    assert "License-File: LICENSE" in meta
    assert "Classifier: Framework :: Apache Airflow :: Provider" in meta
    assert not [line for line in meta if line.startswith("License: ")]  # the deprecated free-text form
    assert "Apache License" in license_text
    assert "Version 2.0, January 2004" in license_text
