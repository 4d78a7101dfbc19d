"""make test's two xdist workers: which modules share a worker, and the controller's scheduler reading the groups
the workers publish."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests import xdist_groups as groups
from tests.conftest import xdist_groups


def _item(nodeid: str, *fixtures: str, browser: bool = False) -> Any:
    marker = object() if browser else None
    return SimpleNamespace(nodeid=nodeid, fixturenames=list(fixtures), get_closest_marker=lambda name: marker)


def test_modules_sharing_airflow_or_the_readback_sample_share_a_group() -> None:
    items = [
        _item("tests/browser/test_form.py::test_a", "ui", browser=True),
        _item("tests/dags/test_celery.py::test_c", "celery", "airflow_celery"),
        _item("tests/dags/test_refresh.py::test_r", "airflow_scheduler"),
        _item("tests/dags/test_ingest.py::test_x", "source"),  # a test without the fixture: its module decides
        _item("tests/dags/test_ingest.py::test_y", "airflow_home"),
        _item("tests/jobs/test_cluster.py::test_c", "spark_cluster"),
        _item("tests/readback/test_latency.py::test_l", "proxy"),
        _item("tests/readback/test_resume.py::test_r", "stored"),
        _item("tests/unit/test_cli.py::test_help"),
    ]
    assert xdist_groups(items) == {
        "tests/browser/test_form.py": "airflow-celery",  # the browser on the deployed shape
        "tests/dags/test_celery.py": "airflow-celery",
        "tests/dags/test_refresh.py": "airflow-scheduler",
        "tests/dags/test_ingest.py": "airflow-dags",
        "tests/jobs/test_cluster.py": "tests/jobs/test_cluster.py",  # the cluster: one test at a time, by lock
        "tests/readback/test_latency.py": "readback",
        "tests/readback/test_resume.py": "readback",
        "tests/unit/test_cli.py": "tests/unit/test_cli.py",
    }


def test_the_controller_splits_by_what_a_worker_published(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(groups.GROUPS_ENV, str(tmp_path / "groups.json"))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    groups.publish({"tests/dags/test_a.py": "airflow-dags", "tests/dags/test_b.py": "airflow-dags"})
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    config = SimpleNamespace(option=SimpleNamespace(tx=["2*popen"], dist="loadscope", loadscopereorder=False))
    config.getvalue = lambda name: getattr(config.option, name)
    scheduler = groups.make_scheduler(config, None)  # type: ignore[arg-type]
    assert scheduler._split_scope("tests/dags/test_a.py::test_one") == "airflow-dags"
    assert scheduler._split_scope("tests/dags/test_b.py::test_two[x]") == "airflow-dags"
    assert scheduler._split_scope("tests/unit/test_c.py::test_three") == "tests/unit/test_c.py"
