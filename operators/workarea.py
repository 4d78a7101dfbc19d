"""Task hooks that carry a dataset's work folder between tasks through object storage (``$IMGEST_STATE_URL``).

Every task of the imgest DAGs runs ``pull_work`` before it executes and ``push_work`` after it succeeds
(``work_hooks``, in each DAG's ``default_args``), so a task may run on another worker or pod than the one
before it: it finds the manifest, plans, reports, split files and refresh state the earlier tasks wrote. Without
``$IMGEST_STATE_URL`` both do nothing (one machine, or a work folder every worker mounts). The store is reached
through the ``aws_default`` connection.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


def _request(context: Any) -> dict[str, Any]:
    """The run's request as `validate` resolved it ({} in validate itself)."""
    request = context["ti"].xcom_pull(task_ids="validate") if context["ti"].task_id != "validate" else None
    return request if isinstance(request, dict) else {}


def _dataset(context: Any, fixed: str | None) -> str:
    return fixed or str(_request(context).get("dataset", ""))


def _ensure_sample(context: Any) -> None:
    """A run of the generated sample reads it on whichever host a task runs: generate it here too (the same spec
    gives the same bytes on every host, so the job, the verify and the read-back see what the scan saw)."""
    request = _request(context)
    if request.get("sample") and request.get("dataset"):
        from imgest.core.paths import state_dir
        from imgest.sources.devdata.sample import DEMO_SAMPLE, ensure_sample

        ensure_sample(state_dir() / "demo" / str(request["dataset"]), DEMO_SAMPLE)


def _area(context: Any, dataset: str) -> Any:
    from imgest.core.lock_stores import state_url
    from imgest.core.workarea import work_area

    url = state_url()
    if url is None or not dataset:
        return None
    from imgest.operators.hooks import store_settings

    return work_area(dataset, store_settings(url, "aws_default"))


def work_hooks(dataset: str | None = None) -> dict[str, Callable[..., None]]:
    """``pre_execute`` / ``post_execute`` for a DAG's default_args; DATASET for a DAG of one dataset, else the
    dataset the run's ``validate`` task resolved."""
    from imgest.core.workarea import ephemeral

    def pull_work(context: Any) -> None:
        name = _dataset(context, dataset)
        if name and ephemeral():  # this task starts on an empty disk, as a fresh pod does
            import shutil

            from imgest.core.workdir import dataset_workdir

            shutil.rmtree(dataset_workdir(name), ignore_errors=True)
        area = _area(context, name)
        if area is not None:
            log.info("work area %s: pulled %d files into %s", area.prefix, area.pull(), area.local)
        if dataset is None:  # ingest_imagenet's run: its source may be the generated sample
            _ensure_sample(context)

    def push_work(context: Any, result: Any = None) -> None:
        area = _area(context, _dataset(context, dataset))
        if area is None:
            return
        sent, deleted = area.push()
        log.info("work area %s: pushed %d files, deleted %d", area.prefix, sent, deleted)
        if ephemeral():  # the store holds it all: nothing of the run stays on this disk
            import shutil

            shutil.rmtree(area.local, ignore_errors=True)

    return {"pre_execute": pull_work, "post_execute": push_work}
