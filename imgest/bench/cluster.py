"""`imgest bench cluster`: the cost of the cluster path. The shard job on `local[N]` against the same job
on the Spark standalone cluster (`imgest services up spark`) with the same N total cores, same input.

Each round runs spark-submit end to end (JVMs, Spark session, shipping the package, executors starting)
and also reads the job's own in-job seconds from its summary; medians of the rounds, with min and max.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from imgest.bench.machine import machine_info
from imgest.bench.measure import spread
from imgest.bench.pack import dataset
from imgest.core import workdir
from imgest.core.report import bar_chart, describe_machine, format_table, write_json
from imgest.services.spark_cluster import SparkCluster
from imgest.sources.manifest import iter_manifest
from imgest.spark.conf import submit_env
from imgest.spark.submit import submit_command


def run_pack(manifest: Path, out: Path, master: str, max_count: int) -> dict[str, float]:
    """One spark-submit of the shard job on MASTER into the folder OUT: wall and in-job seconds."""
    summary = out / "summary.json"
    args = ["--manifest-dir", str(manifest), "--dest", str(out / "shards"), "--max-count", str(max_count)]
    args += ["--summary-json", str(summary)]
    t0 = time.perf_counter()
    proc = subprocess.run(
        submit_command("pack_shards", args, master), env=submit_env(master), capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"the shard job on {master} failed: " + proc.stderr[-2000:])
    data = json.loads(summary.read_text())
    return {"wall_s": wall, "in_job_s": data["seconds"], "samples": data["samples"]}


def run(cluster: SparkCluster, images: int, rounds: int, max_count: int) -> dict[str, Any]:
    """ROUNDS alternating runs on local[N] and on CLUSTER (N = its total cores), same dataset of IMAGES."""
    manifest = dataset(images)
    cores = cluster.workers * cluster.cores
    masters = {f"local[{cores}]": f"local[{cores}]", "standalone cluster": cluster.master_url}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in masters}
    with tempfile.TemporaryDirectory(prefix="imgest-bench-cluster-") as tmp:
        for i in range(rounds):
            for name, master in masters.items():  # alternate, so drift hits both alike
                out = Path(tmp) / f"{name[:5]}-{i}"
                runs[name].append(run_pack(manifest, out, master, max_count))
    rows = []
    for name, results in runs.items():
        wall, in_job = spread([r["wall_s"] for r in results]), spread([r["in_job_s"] for r in results])
        rows.append(
            {
                "master": name,
                "cores": cores,
                "wall_s": wall["median"],
                "wall_min_s": wall["min"],
                "wall_max_s": wall["max"],
                "in_job_s": in_job["median"],
                "in_job_min_s": in_job["min"],
                "in_job_max_s": in_job["max"],
            }
        )
    base = rows[0]
    for row in rows:
        row["wall_vs_local"] = round(row["wall_s"] / base["wall_s"], 2)
        row["in_job_vs_local"] = round(row["in_job_s"] / base["in_job_s"], 2)
    return {
        "benchmark": "cluster",
        "job": "pack_shards (JPEG 256/224, shards to a local folder)",
        "images": sum(1 for _ in iter_manifest(manifest / workdir.MANIFEST)),
        "rounds": rounds,
        "cluster": {"master": cluster.master_url, "workers": cluster.workers, "cores_per_worker": cluster.cores},
        "machine": machine_info(),
        "rows": rows,
        "runs": runs,
    }


COLUMNS = [
    ("master", "master"),
    ("cores", "cores"),
    ("wall_s", "wall s (median)"),
    ("wall_min_s", "min"),
    ("wall_max_s", "max"),
    ("in_job_s", "in-job s (median)"),
    ("in_job_min_s", "min"),
    ("in_job_max_s", "max"),
    ("wall_vs_local", "wall x local"),
]


def main(json_out: Path, plot: Path | None, images: int, rounds: int, max_count: int) -> dict[str, Any]:
    """Start the cluster if it is not running (and stop it afterwards), run, print, write JSON and plot."""
    cluster = SparkCluster.default()
    started = not cluster.answers() and cluster.up().started
    try:
        report = run(cluster, images, rounds, max_count)
    finally:
        if started:
            cluster.down()
    print(describe_machine(report["machine"]))
    print(f"{report['images']} images, {rounds} rounds, shard job on the same total cores")
    print(format_table(report["rows"], COLUMNS))
    write_json(json_out, report)
    if plot is not None:
        rows = report["rows"]
        bar_chart(
            plot,
            f"Shard job, {report['images']} images: local vs standalone cluster (median s, lower is better)",
            [r["master"] for r in rows],
            {"wall s": [r["wall_s"] for r in rows], "in-job s": [r["in_job_s"] for r in rows]},
            "seconds",
        )
    return report
