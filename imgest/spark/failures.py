"""How a Spark job ends badly: one sentence first (the trace stays in the log), and "nothing was ingestible".

A failure inside a Spark task reaches the driver as a Py4J error whose text holds the Python traceback of the
worker under hundreds of Java frames. ``failure_sentence`` digs out the imgest error (or the last Python error
line) so the job's last log line, and the CLI's first line, say what happened.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from pathlib import Path
from typing import Any

from imgest.core import workdir
from imgest.core.errors import ImgestError, NothingIngestibleError

IMGEST_ERROR = re.compile(r"^\s*imgest\.[\w.]+?\.\w+: (?P<message>.+)$")
OTHER_ERROR = re.compile(r"^[\s:]*(?:[a-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Unavailable|Timeout)\w*: (?P<message>.+)$")
ERROR_MARK = " ERROR imgest."  # how a job's error line looks in a spark-submit log (see logging formats of jobs/)


def failure_sentence(exc: BaseException) -> str:
    """The one line that says why EXC happened: an imgest error from a Spark task, else the last Python error."""
    if isinstance(exc, ImgestError):
        return str(exc)
    lines = str(exc).splitlines()
    imgest = [m["message"] for line in lines if (m := IMGEST_ERROR.match(line))]
    if imgest:
        return imgest[-1].strip()  # the worker's own error, under the Java frames
    other = [m["message"] for line in lines if (m := OTHER_ERROR.match(line))]
    if other:
        return other[0].strip()  # Spark's summary ("Job aborted due to stage failure: ...")
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()


def report_failure(log: logging.Logger, what: str, exc: BaseException) -> int:
    """Log the full trace at DEBUG level (it stays in the log file) and the sentence last; returns exit code 2."""
    log.debug("%s failed", what, exc_info=exc)
    log.error("%s failed: %s", what, failure_sentence(exc))
    return 2


def nothing_ingestible(manifest_dir: Path, target: str, rows: int, quarantined: list[dict[str, Any]]) -> ImgestError:
    """Write the job's quarantine list beside the manifest; the error to raise names it."""
    path = manifest_dir / workdir.job_quarantine(target)
    reasons = dict(sorted(Counter(str(q.get("reason")) for q in quarantined).items()))
    entries = sorted(quarantined, key=lambda q: str(q.get("path")))
    report = {"candidates": rows, "stored": 0, "quarantined": len(quarantined), "by_reason": reasons}
    path.write_text(json.dumps({**report, "entries": entries}, indent=2) + "\n")
    why = " ".join(f"{r}={n}" for r, n in reasons.items()) or "none"
    return NothingIngestibleError(
        f"nothing was ingestible: all {rows} candidates were quarantined ({why}); nothing was stored or "
        f"published; quarantine list: {path} (scan's: {manifest_dir / workdir.SCAN_QUARANTINE})"
    )


def last_error_sentence(log_file: Path) -> str | None:
    """The message of the last ERROR line an imgest job wrote to LOG_FILE, if any."""
    try:
        text = log_file.read_text(errors="replace")
    except OSError:
        return None
    found = [line.split(": ", 1)[-1] for line in text.splitlines() if ERROR_MARK in line and ": " in line]
    return found[-1].strip() if found else None
