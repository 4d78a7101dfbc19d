"""A job started while its command still scans: the Spark session starts beside the scan instead of after it.

`imgest ingest cassandra SRC` scans SRC, then submits the job; the job's first seconds (spark-submit, the JVM, the
session) need nothing from the scan. So the command starts the job first, with ``--wait-for-scan MARKER``, and scans
meanwhile (1.3 s of a 32,000-image folder on 2 cores, overlapped with the session's 2.5 s). The job reads the
manifest only once MARKER.done exists; MARKER.failed (the scan's error) or a command gone (the pid MARKER holds)
ends it without touching the store.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from imgest.core.errors import ImgestError

POLL_S = 0.02


class ScanFailed(ImgestError):
    """The command's scan failed or the command went away: the job stops before reading the manifest."""


class ScanHandoff:
    """The command's side: ``marker`` to pass to the job, then ``done()`` or ``failed(error)``; ``remove()`` at the
    end."""

    def __init__(self, work: Path) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.marker = work / f".scan-{secrets.token_hex(6)}"
        self.marker.write_text(f"{os.getpid()}\n")

    def done(self) -> None:
        self.marker.with_suffix(".done").touch()

    def failed(self, error: BaseException) -> None:
        tmp = self.marker.with_suffix(".failing")
        tmp.write_text(f"{type(error).__name__}: {error}\n")
        tmp.replace(self.marker.with_suffix(".failed"))

    def remove(self) -> None:
        for suffix in ("", ".done", ".failed", ".failing"):
            self.marker.with_suffix(suffix).unlink(missing_ok=True)


def wait_for_scan(marker: Path | None, poll_s: float = POLL_S) -> float:
    """The job's side: return once MARKER.done exists (at once without a MARKER); the seconds waited. Raises
    ScanFailed with the scan's error, or when the command that scans (MARKER's pid) is gone."""
    if marker is None:
        return 0.0
    t0 = time.monotonic()
    pid = int(marker.read_text().strip())
    while True:
        if marker.with_suffix(".done").exists():
            return time.monotonic() - t0
        failed = marker.with_suffix(".failed")
        if failed.exists():
            raise ScanFailed(f"the scan failed, so nothing was ingested: {failed.read_text().strip()}")
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            raise ScanFailed(f"the command that started this job (pid {pid}) ended before its scan did") from None
        except PermissionError:
            pass  # alive, another user's
        time.sleep(poll_s)
