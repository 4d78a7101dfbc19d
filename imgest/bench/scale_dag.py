"""`imgest bench scale --dag`: `ingest_imagenet` end to end through Airflow at each size, the tasks back to back.

`imgest bench scale` runs each step in a process of its own, with the servers idle in between; a user's run has
them back to back: the split's token-range scan starts the moment the bulk load gives compaction back, on a node
that holds the load's SSTables. At 1.33 M images that is where the embedded node died (``OutOfMemoryError`` in
direct memory, 804 SSTables). So this part runs the real DAG (``airflow dags test ingest_imagenet``) for each target
and size, and records per run: each task's state and seconds, the Cassandra node's peak heap and direct memory (JMX,
``imgest.bench.node_memory``), the data and metadata tables' SSTables after the load (the most the node held), the
read-back check's share of the run, whether the node still answers and any ``OutOfMemoryError`` in its log.

Targets: ``cassandra`` (the DAG's default write path, ``auto``: bulk from 20,000 rows), ``cassandra-cql``,
``cassandra-bulk``, ``shards``.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from imgest.bench.machine import machine_info
from imgest.core.report import describe_machine, format_table, pyplot, save_figure, write_json

log = logging.getLogger(__name__)
WRITE_PATHS = {"cassandra": "auto", "cassandra-cql": "cql", "cassandra-bulk": "bulk"}


def dag_conf(target: str, label: str, source: Path, bucket: str) -> dict[str, Any]:
    """The trigger conf of one run: every setting at its default but the source, names and write path."""
    dataset = f"dag-{label}-{target}"
    base = target.split("-", 1)[0]
    conf: dict[str, Any] = {"source": str(source), "layout": "cls-loc", "dataset": dataset, "target": base}
    if base == "cassandra":
        conf.update(keyspace=dataset.replace("-", "_"), write_path=WRITE_PATHS[target])
    else:
        conf["s3_dest"] = f"s3://{bucket}/{dataset}"
    return conf


def job_summary(conf: dict[str, Any]) -> dict[str, Any]:
    """The ingest job's JSON summary of a run of CONF (its work folder), {} if it wrote none."""
    from imgest.core import workdir

    name = workdir.CASSANDRA_SUMMARY if conf["target"] == "cassandra" else workdir.SHARDS_SUMMARY
    path = workdir.dataset_workdir(conf["dataset"]) / name
    return dict(json.loads(path.read_text())) if path.is_file() else {}


def oom_lines(log_file: Path, offset: int) -> list[str]:
    """Lines of the node's system.log after byte OFFSET that report an OutOfMemoryError."""
    if not log_file.is_file():
        return []
    with log_file.open("rb") as fh:
        fh.seek(offset)
        return [ln.decode(errors="replace").strip() for ln in fh if b"OutOfMemoryError" in ln][:5]


def run_one(target: str, label: str, source: Path, images: int) -> dict[str, Any]:
    """One `airflow dags test ingest_imagenet` run of TARGET over SOURCE, from empty, measured."""
    from imgest.bench.node_memory import NodeMemory
    from imgest.bench.scale_run import reset_dataset
    from imgest.services import AirflowServer, CassandraServer, S3Server
    from imgest.services.demo import run_dag, task_durations

    cassandra, s3, airflow = CassandraServer.default(), S3Server.default(), AirflowServer.default()
    conf = dag_conf(target, label, source, s3.bucket)  # the embedded server's bucket
    keyspace = conf.get("keyspace", conf["dataset"].replace("-", "_"))
    reset_dataset(conf["dataset"], keyspace, conf.get("s3_dest", f"s3://{s3.bucket}/none"))
    airflow.prepare(cassandra, s3)
    system_log = cassandra.home / "logs" / "system.log"
    offset = system_log.stat().st_size if system_log.is_file() else 0
    tables = [f"{keyspace}.data", f"{keyspace}.metadata"] if "keyspace" in conf else []
    print(f"  {target} {label} ({images:,} images): airflow dags test ingest_imagenet ...", end="", flush=True)
    load = machine_info().get("load_average")
    with NodeMemory(f"127.0.0.1:{cassandra.jmx_port}", tables, interval_ms=500) as node:
        ok, seconds, tail = run_dag(airflow, conf)
    tasks = [{"task": t, "state": s, "seconds": secs} for t, s, secs in task_durations(airflow, "ingest_imagenet")]
    ingest = job_summary(conf)
    read_s = next((t["seconds"] for t in tasks if t["task"] == "read_throughput"), None)
    row = {
        "target": target,
        "size": label,
        "images": images,
        "conf": conf,
        "ok": ok,
        "wall_s": round(seconds, 1),
        "load_avg_at_start": load,
        "tasks": tasks,
        "failed_tasks": [t["task"] for t in tasks if t["state"] not in ("success", "skipped", None)],
        "write_path": (ingest.get("write_path") or {}).get("path"),
        "bulk_loads": ingest.get("bulk_loads"),
        "stored": ingest.get("stored", ingest.get("samples")),
        "node": node.summary(),
        "node_answers_after": cassandra.answers(),
        "node_oom_lines": oom_lines(system_log, offset),
        "read_back_share": round(read_s / seconds, 3) if read_s and seconds else None,
    }
    if not ok:
        row["output_tail"] = tail[-2000:]
    state = "success" if ok else f"FAILED ({', '.join(row['failed_tasks']) or 'see output_tail'})"
    print(f" {state} in {seconds:.0f} s; node peak heap {row['node']['peak_heap_mib']} MiB, direct "
          f"{row['node']['peak_direct_mib']} MiB; SSTables {row['node']['peak_sstables']}", flush=True)  # fmt: skip
    return row


def summary_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per run for the printed table."""
    out = []
    for run in runs:
        secs = {t["task"]: t["seconds"] for t in run["tasks"]}
        ingest = secs.get("ingest_cassandra") or secs.get("ingest_shards")
        out.append(
            {
                "target": run["target"],
                "images": run["images"],
                "ok": "yes" if run["ok"] and run["node_answers_after"] and not run["node_oom_lines"] else "NO",
                "wall_s": run["wall_s"],
                "ingest_s": ingest,
                "split_s": secs.get("build_split"),
                "read_s": secs.get("read_throughput"),
                "read_share": run["read_back_share"],
                "heap": run["node"]["peak_heap_mib"],
                "direct": run["node"]["peak_direct_mib"],
                "sstables": "/".join(str(v) for v in run["node"]["peak_sstables"].values()) or "-",
            }
        )
    return out


COLUMNS = [
    ("target", "target"),
    ("images", "images"),
    ("ok", "all green, node alive"),
    ("wall_s", "run s"),
    ("ingest_s", "ingest s"),
    ("split_s", "split s"),
    ("read_s", "read-back s"),
    ("read_share", "read-back share"),
    ("heap", "node heap MiB"),
    ("direct", "node direct MiB"),
    ("sstables", "SSTables data/meta"),
]


def plot(path: Path, runs: list[dict[str, Any]]) -> None:
    """Per run: stacked task seconds (left), the node's peak heap and direct memory against its limit (right)."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    labels = [f"{r['target']}\n{r['images']:,}" for r in runs]
    tasks = list(dict.fromkeys(t["task"] for r in runs for t in r["tasks"] if (t["seconds"] or 0) >= 1))
    bottom = [0.0] * len(runs)
    for task in tasks:
        secs = [next((t["seconds"] or 0 for t in r["tasks"] if t["task"] == task), 0) for r in runs]
        left.bar(labels, secs, bottom=bottom, label=task)
        bottom = [b + s for b, s in zip(bottom, secs, strict=True)]
    left.set_ylabel("seconds")
    left.set_title("ingest_imagenet through Airflow: each task's time")
    left.legend(fontsize=7)
    xs = range(len(runs))
    right.bar([x - 0.2 for x in xs], [r["node"]["peak_heap_mib"] for r in runs], width=0.4, label="peak heap")
    right.bar([x + 0.2 for x in xs], [r["node"]["peak_direct_mib"] for r in runs], width=0.4, label="peak direct")
    limits = [r["node"]["heap_max_mib"] for r in runs]
    right.hlines(limits, [x - 0.4 for x in xs], [x + 0.4 for x in xs], colors="r", linestyles=":", label="limit (each)")
    right.set_xticks(list(xs), labels)
    right.set_ylabel("MiB")
    right.set_title("the Cassandra node's memory over the run")
    right.legend(fontsize=7)
    save_figure(fig, path)


def replot(json_path: Path, plot_path: Path) -> None:
    """The plot again from a report's JSON."""
    plot(plot_path, json.loads(json_path.read_text())["runs"])


def main(json_path: Path, plot_path: Path | None, fractions: list[float], targets: list[str]) -> dict[str, Any]:
    """Every target at every fraction of the count set through the DAG; prints the table, writes JSON and the plot."""
    from imgest.bench.scale import prepare_datasets

    info = machine_info()
    print(describe_machine(info))
    datasets = prepare_datasets("count", fractions)
    runs: list[dict[str, Any]] = []
    report: dict[str, Any] = {}
    for label, source, images in datasets:
        for target in targets:
            runs.append(run_one(target, label, Path(source), images))
            report = {"benchmark": "scale-count-dag", "machine": info, "runs": runs, "at": time.strftime("%FT%T%z")}
            write_json(json_path, report)
            if plot_path:
                plot(plot_path, runs)
    print(format_table(summary_rows(runs), COLUMNS))
    print(json.dumps({"failed": [f"{r['target']}/{r['size']}" for r in runs if not r["ok"]]}))
    return report
