"""One step of the `ingest_imagenet` path in a process of its own, as `imgest bench scale` measures it.

`python -m imgest.bench.scale_step STEP STATE` runs STEP with the request and scan result in the JSON file
STATE, calling the same function the DAG's task calls (the Spark steps spark-submit the same job with the
same arguments), and writes what the step returned to STATE's folder as `step-<STEP>.json`. A process per step
gives each its own peak RSS. A step named `<phase>.<sub>` (`refresh_change.plan`) is a step of the
`refresh_<name>` DAG (scan, plan, prepare, ingest, finish) for the dataset registered in the datasets file STATE
names.
"""

from __future__ import annotations

import gc
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from imgest.core.settings import CassandraSettings, S3Settings

log = logging.getLogger(__name__)

JOBS = {"ingest_cassandra": ("ingest_cassandra", "cassandra_args"), "ingest_shards": ("pack_shards", "shards_args")}


def _spark(step: str, state: dict[str, Any]) -> dict[str, Any]:
    """spark-submit the step's job on local[*] with the arguments the scan produced (what the DAG submits)."""
    from imgest.core.settings import s3_env

    job, key = JOBS[step]
    args = list(state["scan"][key])
    if step == "ingest_cassandra":
        settings = CassandraSettings.from_env()
        args += ["--hosts", ",".join(settings.hosts), "--port", str(settings.port)]
    else:
        s3_env(state["dest"])
    return _submit(job, args, Path(state["work"]) / f"spark-{step}.log")


def _submit(job: str, args: list[str], log_file: Path) -> dict[str, Any]:
    """spark-submit JOB with ARGS (a process of its own, measured: no reused driver); returns the job's summary."""
    from imgest.spark.failures import last_error_sentence
    from imgest.spark.submit import run_submit, submit_command

    rc = run_submit(submit_command(job, args), log_file, reuse=False)  # its processes are measured
    if rc != 0:
        raise RuntimeError(f"{job} failed (exit {rc}): {last_error_sentence(log_file)}; log {log_file}")
    return json.loads(Path(args[args.index("--summary-json") + 1]).read_text())


def _cassandra(state: dict[str, Any]) -> CassandraSettings | None:
    """The Cassandra settings of a Cassandra target's refresh (where its ingest recorded the source hashes)."""
    return CassandraSettings.from_env() if state["target"] == "cassandra" else None


def _refresh_conf(state: dict[str, Any]) -> dict[str, Any]:
    """The registered dataset's request for the state's target, read from the datasets file as the DAG does."""
    from imgest.flow.registry import load_registry

    return load_registry(Path(state["datasets_file"])).entry(state["name"]).conf(state["target"])


def _refresh_ingest(state: dict[str, Any]) -> dict[str, Any]:
    """The refresh DAG's ingest task: the target's job with the plan's arguments."""
    from imgest.core.settings import s3_env
    from imgest.flow.request import IngestRequest

    request = IngestRequest.from_conf(_refresh_conf(state))
    args = list(state["plan"]["job_args"])
    if request.target == "cassandra":
        job, settings = "ingest_cassandra", CassandraSettings.from_env()
        args += ["--hosts", ",".join(settings.hosts), "--port", str(settings.port)]
    else:
        job = "pack_shards"
        s3_env(request.shard_dest)
    return _submit(job, args, Path(state["work"]) / f"spark-refresh-{request.target}.log")


def _refresh_steps() -> dict[str, Callable[[dict[str, Any]], Any]]:
    """The tasks of a refresh_<name> DAG's target group (and its scan), by sub-step name."""
    from imgest.flow import refresh, steps
    from imgest.flow.request import IngestRequest

    def prepare(state: dict[str, Any]) -> Any:
        conf = _refresh_conf(state)
        if state["target"] == "cassandra":
            return steps.prepare_cassandra(conf, Path(state["work"]), CassandraSettings.from_env())
        return steps.prepare_bucket(IngestRequest.from_conf(conf).shard_dest, S3Settings.from_env())

    return {
        "scan": lambda s: steps.scan_step(_refresh_conf(s)),
        "plan": lambda s: refresh.plan_refresh(_refresh_conf(s), Path(s["work"]), _cassandra(s)),
        "prepare": prepare,
        "ingest": _refresh_ingest,
        "finish": lambda s: refresh.finish_refresh(
            _refresh_conf(s), Path(s["work"]), CassandraSettings.from_env(), S3Settings.from_env()
        ),
    }


def _started() -> float:
    """Seconds this step's process has run (a process per step: the task's start-up, as the DAG's task counts it)."""
    from imgest.readback.budget import process_age

    return process_age()


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
            s["conf"], work(s), CassandraSettings.from_env(), S3Settings.from_env(), s.get("run_s"), _started()
        ),
    }


def run_step(step: str, state_file: Path) -> Path:
    """Run STEP with the state in STATE_FILE; returns the file holding its result."""
    state = json.loads(state_file.read_text())
    run = _refresh_steps()[step.split(".", 1)[1]] if "." in step else _steps()[step]
    result = run(state)
    out = state_file.parent / f"step-{step}.json"
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    (state_file.parent / f"step-{step}.hwm").write_text(f"{own_peak_rss()}\n")
    return out


def own_peak_rss() -> int:
    """This process's peak RSS in bytes since its exec (VmHWM). Not ru_maxrss: Linux carries the parent's
    high-water mark across fork and exec into it, so a small step started by a large benchmark reads large."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m imgest.bench.scale_step STEP STATE_JSON", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_step(argv[0], Path(argv[1]))
    # The result is written; what is left is the interpreter's exit, whose collections walk every object torch,
    # DALI and boto3 made (DALI's exit hook collects once more): 1-3 s after a read-back, counted in the step's
    # wall time. Frozen, the heap is left to the process's end. (A DAG task records its end before its exit.)
    gc.freeze()
    return 0


if __name__ == "__main__":
    sys.exit(main())
