"""`make test`'s two pytest-xdist workers (``-n 2 --dist loadscope``): which tests must share a worker.

xdist's own ``loadgroup`` no longer works with pytest 9.2 (it renames ``item._nodeid``, which pytest stopped
reading), so the controller's scheduler here groups by module instead, through a mapping the workers write while
they collect: only the workers see each test's fixtures. A group's tests run on one worker, in collection order.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

GROUPS_ENV = "IMGEST_TEST_GROUPS_FILE"


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def start(config: pytest.Config) -> None:
    """Controller, before its workers start: the file they will write the groups to (they inherit the variable)."""
    if os.environ.get("PYTEST_XDIST_WORKER") or getattr(config.option, "dist", "no") != "loadscope":
        return
    os.environ[GROUPS_ENV] = str(Path(tempfile.mkdtemp(prefix="imgest-groups-")) / "groups.json")


def finish() -> None:
    """Controller, at the session's end: remove the groups file and its folder."""
    path = os.environ.get(GROUPS_ENV)
    if path and not os.environ.get("PYTEST_XDIST_WORKER") and Path(path).parent.name.startswith("imgest-groups-"):
        shutil.rmtree(Path(path).parent, ignore_errors=True)


def publish(groups: dict[str, str]) -> None:
    """Worker, at collection: write module -> group (every worker writes the same; the rename is atomic)."""
    path = os.environ.get(GROUPS_ENV)
    if not path or not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    tmp = Path(f"{path}.{os.environ['PYTEST_XDIST_WORKER']}")
    tmp.write_text(json.dumps(groups))
    tmp.replace(path)


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """A LoadScopeScheduling whose scopes are the groups the workers published (a module of its own otherwise)."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:  # read once: every worker has collected before the scheduler splits
                path = os.environ.get(GROUPS_ENV, "")
                self._groups = json.loads(Path(path).read_text()) if path and Path(path).is_file() else {}
            module = module_of(nodeid)
            return self._groups.get(module, module)

    return GroupScheduling(config, log)
