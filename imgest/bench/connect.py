"""`imgest bench connect`: the Spark Connect route beside spark-submit, on the same standalone cluster and input.

For each size (a tiny generated set for the per-job fixed cost, then the count dataset's 143 k and 1.33 M images,
scanned once) and target (Cassandra over CQL, shards into S3), one job per route: spark-submit to
``spark://`` (the driver JVM in the submitting process, as in an Airflow worker) and the thin Connect client to
``sc://`` (the driver in the Connect server). Measured on the submitting side, what an Airflow worker would carry:
wall seconds, the job's own images/s, CPU seconds and peak RSS of the job's process tree (the client, or
spark-submit with its driver JVM). The routes alternate within a size, so drift hits both alike; the machine's
load over each run is recorded.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from imgest.bench.connect_deferred import run_deferred
from imgest.bench.machine import machine_info
from imgest.bench.measure import QuietWatch, RssSampler, TreeSampler, server_pids
from imgest.core import workdir
from imgest.core.paths import state_dir
from imgest.core.report import bar_chart, describe_machine, format_table, write_json
from imgest.core.s3_prefix import delete_prefix
from imgest.services import CassandraServer, S3Server
from imgest.services.spark_connect import SparkConnectServer
from imgest.spark.conf import submit_env
from imgest.spark.submit import submit_command

TARGETS = {"cassandra": "ingest_cassandra", "shards": "pack_shards"}
FRACTIONS = {"143k": 0.1075, "1.33M": 1.0}  # of the count dataset (1,331,167 images; 0.1075: 144,002)
WORKER_RSS_TARGET_MB, WORKER_CPU_TARGET = 300, 0.05  # the targets for the Connect route


def manifest_for(size: str) -> Path:
    """The scanned manifest folder of SIZE: 'tiny' (1,000 generated images) or a count-dataset size (generated once
    by imgest bench scale's helper), scanned once into $IMGEST_HOME/bench/connect-<size>/."""
    if size == "tiny":
        from imgest.bench.pack_data import dataset

        return dataset(1000)
    out = state_dir() / "bench" / f"connect-{size}"
    if not (out / workdir.MANIFEST).exists():
        from imgest.bench.scale import prepare_datasets
        from imgest.sources.scan import scan_to_dir

        [(_, src, _)] = prepare_datasets("count", [FRACTIONS[size]])
        print(f"scanning {src} into {out} (once)", flush=True)
        scan_to_dir(Path(src), out, dataset=f"connect{size.replace('.', '')}")
    return out


def job_args(target: str, manifest: Path, route: str, s3: S3Server, port: int) -> list[str]:
    """The job's arguments: a keyspace or S3 prefix of its own (a fresh write, nothing to skip)."""
    run = uuid.uuid4().hex[:8]
    common = ["--manifest-dir", str(manifest)]
    if target == "cassandra":
        return [*common, "--keyspace", f"bench_connect_{route}_{run}", "--write-path", "cql", "--consistency",
                "ONE", "--port", str(port)]  # fmt: skip
    return [*common, "--dest", f"s3://{s3.bucket}/bench/connect-{route}-{run}"]


def drop_output(args: list[str], s3: S3Server, cassandra: CassandraServer) -> None:
    """Remove what the job of ARGS wrote: its S3 prefix (--dest) or its keyspace (--keyspace)."""
    if "--dest" in args:
        bucket, _, prefix = args[args.index("--dest") + 1].removeprefix("s3://").partition("/")
        delete_prefix(s3.settings().client(), bucket, f"{prefix}/")
    if "--keyspace" in args:
        from imgest.core.settings import CassandraSettings
        from imgest.sinks.cassandra.client import cassandra_session

        settings = CassandraSettings(hosts=(cassandra.host,), port=cassandra.native_port)
        with cassandra_session(settings) as session:
            session.execute(f"DROP KEYSPACE IF EXISTS {args[args.index('--keyspace') + 1]}", timeout=120)


def cores_free(cluster: Any, timeout: float = 120.0) -> float:
    """Wait until no application holds the cluster's cores (the Connect server gives its idle executors back after
    a while); returns the seconds waited, so each route's run starts on an idle cluster."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout and (cluster.master_state() or {}).get("coresused", 0):
        time.sleep(1)
    return round(time.monotonic() - t0, 1)


def run_job(job: str, args: list[str], master: str, env: dict[str, str], log: Path) -> dict[str, Any]:
    """One job on MASTER: wall, the job's summary, the submitting tree's CPU seconds and peak RSS, the load."""
    summary = log.with_suffix(".json")
    cmd = submit_command(job, [*args, "--summary-json", str(summary)], master)
    base = submit_env(master) if master.startswith("spark://") else {}
    with QuietWatch(server_pids()) as quiet, open(log, "w") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env={**base, **env}, stdout=out, stderr=subprocess.STDOUT)
        with TreeSampler([proc.pid]) as cpu, RssSampler(proc.pid, lambda *_: "worker") as rss:
            rc = proc.wait()
        wall = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"{job} on {master} failed (exit {rc}); log {log}")
    done = json.loads(summary.read_text())
    images = done["stored"] if "stored" in done else sum(done["samples"].values())  # Cassandra's, or the shards'
    return {
        "wall_s": round(wall, 2),
        "job_s": done["seconds"],
        "images": images,
        "images_per_s": round(images / done["seconds"], 1),
        "worker_cpu_s": round(cpu.seconds(), 2),
        "worker_cores": round(cpu.seconds() / wall, 3),
        "worker_peak_rss_mb": round(rss.peaks.total.get("worker", 0) / 2**20, 1),
        "worker_held_s": round(wall, 2),  # its process on the worker for the whole job
        "quiet": quiet.result.to_dict(),
    }


def run(sizes: list[str], targets: list[str], env: dict[str, str]) -> list[dict[str, Any]]:
    """Every size x target x route; routes alternate within a size and target."""
    cassandra, s3, connect = CassandraServer.default(), S3Server.default(), SparkConnectServer.default()
    for service in (cassandra, s3):
        if not service.answers():
            raise RuntimeError(f"{service.name} is not running: imgest services up cassandra s3 spark-connect")
    connect.check_running()
    routes = {"spark-submit": connect.cluster.master_url, "connect": connect.url, "connect-deferred": connect.url}
    logs = state_dir() / "bench" / "connect-logs"
    logs.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in sizes:
        manifest = manifest_for(size)
        for target in targets:
            for route, master in routes.items():
                args = job_args(target, manifest, route.replace("-", "_"), s3, cassandra.native_port)
                log = logs / f"{size}-{target}-{route}.log"
                waited = cores_free(connect.cluster)
                print(f"{size} {target} via {route} (cluster idle after {waited} s) ...", flush=True)
                runner = run_deferred if route == "connect-deferred" else run_job
                try:
                    result = runner(TARGETS[target], args, master, env, log)
                finally:  # a 1.33 M run writes 4.6 GB of shards per route: measured, not kept
                    drop_output(args, s3, cassandra)
                rows.append({"size": size, "target": target, "route": route, **result})
                print(f"  {json.dumps({k: v for k, v in result.items() if k != 'quiet'})}", flush=True)
    return rows


def main(json_path: Path, plot: Path | None, sizes: list[str], targets: list[str]) -> dict[str, Any]:
    import os

    s3 = S3Server.default().settings()
    env = {"AWS_ACCESS_KEY_ID": s3.access_key or "", "AWS_SECRET_ACCESS_KEY": s3.secret_key or ""}
    env |= {"IMGEST_S3_ENDPOINT": s3.endpoint_url or "", "IMGEST_STATE_URL": "local"}
    rows = run(sizes, targets, {**os.environ, **env})
    targets_of = {"connect_worker_peak_rss_mb": WORKER_RSS_TARGET_MB, "connect_worker_cores": WORKER_CPU_TARGET}
    report = {"benchmark": "connect", "machine": machine_info(), "rows": rows, "targets": targets_of}
    for r in rows:
        if r["route"].startswith("connect"):
            r["meets_target"] = (
                r["worker_peak_rss_mb"] <= WORKER_RSS_TARGET_MB and r["worker_cores"] <= WORKER_CPU_TARGET
            )
    write_json(json_path, report)
    print(describe_machine(report["machine"]))
    columns = [("size", "size"), ("target", "target"), ("route", "route"), ("wall_s", "wall s"), ("job_s", "job s"),
               ("images_per_s", "images/s"), ("worker_cpu_s", "worker CPU s"), ("worker_cores", "worker cores"),
               ("worker_peak_rss_mb", "peak RSS MB"), ("worker_held_s", "worker held s")]  # fmt: skip
    print(format_table(rows, columns))
    for r in rows:
        print(f"  {r['size']} {r['target']} {r['route']}: {r['quiet']['other_cores']} cores of other processes")
    if plot:
        plots(rows, plot)
    return report


def plots(rows: list[dict[str, Any]], plot: Path) -> None:
    """PLOT: the worker's peak RSS per job and route; PLOT's ``-held`` sibling: the seconds a worker slot was held
    beside the job's wall (what the deferrable route frees)."""
    routes = ("spark-submit", "connect", "connect-deferred")
    groups = [f"{r['size']} {r['target']}" for r in rows if r["route"] == "connect"]
    series = {route: [r["worker_peak_rss_mb"] for r in rows if r["route"] == route] for route in routes}
    bar_chart(plot, "What the Airflow worker carries per job: peak RSS", groups, series, "MB")
    held = {route: [r["worker_held_s"] for r in rows if r["route"] == route] for route in routes}
    held["job wall (deferred)"] = [r["wall_s"] for r in rows if r["route"] == "connect-deferred"]
    title = "Seconds a worker slot is held per job"
    bar_chart(plot.with_name(f"{plot.stem}-held{plot.suffix}"), title, groups, held, "s", log=True)
