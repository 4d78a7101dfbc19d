"""The `check_datasets` DAG's work: read back (and for files, xNVMe-validate) each newly announced version.

Every target's publish task announces the version it made as an Asset event through the `imgest-datasets`
alias, with the request and the version in the event's extra. `check_datasets` is scheduled on that alias;
for each event not already checked by its producer it runs the DALI read-back throughput check over a seeded,
class-balanced sample of the train split (the request's check_sample; 0: every row), and the xNVMe validation
for the files target, and records the reports with the version.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from imgest.core import workdir
from imgest.core.settings import CassandraSettings, S3Settings
from imgest.flow.request import IngestRequest

log = logging.getLogger(__name__)


def versions_to_check(events: Mapping[Any, Iterable[Any]]) -> list[dict[str, Any]]:
    """The extras of the triggering events that carry a request and were not checked by their producer."""
    found = []
    for batch in events.values():
        for event in batch:
            extra = dict(getattr(event, "extra", None) or {})
            if extra.get("conf") and not extra.get("checked"):
                found.append(extra)
            else:
                log.info("skipping event %s (already checked, or no request in it)", extra or event)
    return found


def check_out_dir(dataset: str, target: str, version: str) -> Path:
    """Where the check reports of one version of one target go."""
    return workdir.dataset_workdir(dataset) / "checks" / target / version


def check_version(
    extra: dict[str, Any],
    cassandra: CassandraSettings | None,
    s3: S3Settings | None,
    sample: int | None = None,
) -> dict[str, Any]:
    """Read-back throughput (and xNVMe for files) of the version in EXTRA; reports land in its checks folder.

    The read-back reads a seeded, class-balanced sample of the train split: SAMPLE images when given, else the
    request's check_sample (its default when the event's request predates it); 0 reads every row."""
    from imgest.flow.steps import read_throughput

    conf = {**extra["conf"], "read_check": True}
    if sample is not None:
        conf["check_sample"] = sample
    request = IngestRequest.from_conf(conf)
    version = str(extra.get("version") or "latest")
    out = check_out_dir(request.dataset, request.target, version)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"dataset": request.dataset, "target": request.target, "version": version}
    result["read_throughput"] = read_throughput(conf, out, cassandra, s3)
    if request.target == "files":
        from imgest.validate.check import CheckConfig
        from imgest.validate.step import validate_xnvme_step

        result["validate_xnvme"] = validate_xnvme_step(
            Path(request.files_location),
            out,
            config=CheckConfig(sample=request.check_sample),
            loop_fs=request.xnvme_loop_fs or None,
        )
    log.info("checked %s/%s version %s: %s", request.dataset, request.target, version, result)
    return result
