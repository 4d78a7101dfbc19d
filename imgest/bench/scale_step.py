"""One step of the `ingest_imagenet` path in a process of its own, as `imgest bench scale` measures it.

`python -m imgest.bench.scale_step STEP STATE` runs STEP with the request and scan result in the JSON file
STATE, calling the same function the DAG's task calls (the Spark steps spark-submit the same job with the
same arguments), and writes what the step returned to STATE's folder as `step-<STEP>.json`. A process per step
gives each its own peak RSS.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from imgest.core.settings import CassandraSettings, S3Settings
from imgest.core.workdir import job_summary

log = logging.getLogger(__name__)

JOBS = {"ingest_cassandra": ("ingest_cassandra", "cassandra_args"), "ingest_shards": ("pack_shards", "shards_args")}


def _spark(step: str, state: dict[str, Any]) -> dict[str, Any]:
    """spark-submit the step's job on local[*] with the arguments the scan produced (what the DAG submits)."""
    from imgest.cli.common import s3_env
    from imgest.spark.failures import last_error_sentence
    from imgest.spark.submit import run_submit, submit_command

    job, key = JOBS[step]
    args = list(state["scan"][key])
    if step == "ingest_cassandra":
        settings = CassandraSettings.from_env()
        args += ["--hosts", ",".join(settings.hosts), "--port", str(settings.port)]
    else:
        s3_env(state["dest"])
    log_file = Path(state["work"]) / f"spark-{step}.log"
    rc = run_submit(submit_command(job, args), log_file, reuse=False)  # its processes are measured
    if rc != 0:
        raise RuntimeError(f"{job} failed (exit {rc}): {last_error_sentence(log_file)}; log {log_file}")
    summary = Path(state["scan"]["manifest_dir"]) / job_summary(step.removeprefix("ingest_"))
    return json.loads(summary.read_text())


def _steps() -> dict[str, Callable[[dict[str, Any]], Any]]:
    from imgest.flow import steps

    def work(state: dict[str, Any]) -> Path:
        return Path(state["scan"]["manifest_dir"])

    return {
        "scan": lambda s: steps.scan_step(s["conf"]),
        "prepare_cassandra": lambda s: steps.prepare_cassandra(s["conf"], work(s), CassandraSettings.from_env()),
        "ingest_cassandra": lambda s: _spark("ingest_cassandra", s),
        "verify_cassandra": lambda s: steps.verify_cassandra(
            s["conf"], work(s), CassandraSettings.from_env(), s["verify_sample"]
        ),
        "prepare_bucket": lambda s: steps.prepare_bucket(s["dest"], S3Settings.from_env()),
        "ingest_shards": lambda s: _spark("ingest_shards", s),
        "verify_shards": lambda s: steps.verify_shards(s["dest"], S3Settings.from_env()),
        "build_split": lambda s: steps.build_split(
            s["conf"], work(s), CassandraSettings.from_env(), S3Settings.from_env()
        ),
        "read_throughput": lambda s: steps.read_throughput(
            s["conf"], work(s), CassandraSettings.from_env(), S3Settings.from_env()
        ),
    }


def run_step(step: str, state_file: Path) -> Path:
    """Run STEP with the state in STATE_FILE; returns the file holding its result."""
    state = json.loads(state_file.read_text())
    result = _steps()[step](state)
    out = state_file.parent / f"step-{step}.json"
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m imgest.bench.scale_step STEP STATE_JSON", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_step(argv[0], Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
