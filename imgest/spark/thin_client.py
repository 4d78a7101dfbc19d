"""`python -m imgest.spark.thin_client JOB.py ARGS...`: a job run as Spark Connect's thin client.

What `imgest.spark.submit.connect_command` runs: the job script as its own `__main__` (as `python JOB.py` would,
its folder first on sys.path, not the working folder), after `imgest.spark.driver_memory.lean_allocators` set the
allocators, which must happen before anything imports pyarrow. Nothing here imports more than the standard library.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

from imgest.spark.driver_memory import lean_allocators


def main(argv: Sequence[str] | None = None) -> None:
    """Run JOB.py with ARGS (argv: [JOB.py, ARGS...]); its exit is the process's."""
    job, *args = list(sys.argv[1:] if argv is None else argv) or [""]
    if not job.endswith(".py") or not Path(job).is_file():
        sys.exit(f"usage: python -m imgest.spark.thin_client JOB.py [ARGS...] (no job script at {job!r})")
    lean_allocators()
    sys.argv = [job, *args]
    sys.path[0] = str(Path(job).resolve().parent)  # -m put the working folder there; `python JOB.py` puts its own
    runpy.run_path(job, run_name="__main__")


if __name__ == "__main__":
    main()
