"""`imgest bench read`: DALI read throughput from Cassandra, shards (folder and S3) and files, same images.

One generated dataset is stored three ways by the project's own jobs (Cassandra tables, shards in a folder
and on S3, files); every reader then reads the same train rows through the same DALI pipeline, pinned the same
way (servers on one core, the reader on the other), raw bytes and the CPU training pipeline, median of ROUNDS.
A latency sweep puts a real TCP proxy (Toxiproxy) between the readers and Cassandra / S3 and adds round trips.
"""

from __future__ import annotations

import json
import logging
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from imgest.bench.report import describe_machine, format_table, machine_info, write_json
from imgest.core.paths import state_dir
from imgest.core.settings import CassandraSettings, S3Settings, env_int
from imgest.readback.check import ReadCheckOptions
from imgest.readback.datasets import ReadSet
from imgest.readback.measure import RunResult

log = logging.getLogger(__name__)
KEYSPACE = "bench_read"  # one keyspace per dataset size: verify and read-back count every row of a table


def prepare(images: int) -> dict[str, Any]:
    """Generate and store the dataset three ways (cached in the state folder); returns where each copy is."""
    from imgest.cli import main as cli
    from imgest.sources.devdata.sample import SampleSpec, write_sample

    root = state_dir() / "bench" / f"read-{images}"
    where = {
        "src": root / "src",
        "work": root / "work",
        "files": root / "files",
        "shards": root / "shards",
        "s3": f"s3://imgest/bench/read-{images}",
        "dataset": f"read{images}",
        "keyspace": f"{KEYSPACE}_{images}",
    }
    if not (root / "src").is_dir():
        write_sample(root / "src", SampleSpec("imagefolder", 10, max(1, images // 10), 0, seed=3, large_every=0))
    base = [str(where["src"]), "--work-dir", str(where["work"]), "--dataset", where["dataset"]]
    steps = [
        (where["files"] / "manifest.json", ["ingest", "files", *base, "--dest", str(where["files"])]),
        (where["shards"] / "manifest.json", ["ingest", "shards", *base, "--dest", str(where["shards"])]),
        (None, ["ingest", "shards", *base, "--dest", where["s3"]]),
        (None, ["ingest", "cassandra", *base, "--keyspace", where["keyspace"], "--verify"]),
    ]
    marker = root / "prepared.json"
    for done, argv in [] if marker.is_file() else steps:
        if done is not None and done.is_file():
            continue
        if cli([*argv[:2], *argv[2:], "--max-count", "500"] if argv[1] == "shards" else argv) != 0:
            raise RuntimeError(f"preparing the benchmark dataset failed: imgest {' '.join(argv)}")
    marker.write_text(json.dumps({k: str(v) for k, v in where.items()}))
    return where


def read_sets(
    where: dict[str, Any], cassandra: CassandraSettings, s3: S3Settings, sample: int = 0
) -> dict[str, ReadSet]:
    """The train rows of each stored copy: every row, or a seeded class-balanced SAMPLE (whole shards for shards)."""
    from imgest.readback.datasets import cassandra_set, files_set, shards_set
    from imgest.sinks.cassandra.client import cassandra_session
    from imgest.sinks.cassandra.schema import TableLayout
    from imgest.sinks.shards.store import open_store

    with cassandra_session(cassandra) as session:
        cset = cassandra_set(session, TableLayout(where["keyspace"]), where["dataset"], sample=sample)
    return {
        "files": files_set(Path(where["files"]), sample=sample),
        "shards": shards_set(open_store(str(where["shards"])), sample=sample),
        "s3": shards_set(open_store(where["s3"], s3), sample=sample),
        "cassandra": cset,
    }


def one_round(
    sets: dict[str, ReadSet],
    where: dict[str, Any],
    cassandra: CassandraSettings,
    s3: S3Settings,
    opts: ReadCheckOptions,
) -> tuple[list[RunResult], list[str]]:
    """Every reader, every mode, once."""
    from imgest.readback.check import cassandra_runs, files_runs, folder_shard_runs, s3_shard_runs

    bucket, _, prefix = where["s3"][5:].partition("/")
    results = files_runs(sets["files"], opts) + folder_shard_runs(sets["shards"], str(where["shards"]), opts)
    s3_results, skipped = s3_shard_runs(sets["s3"], s3, bucket, prefix, opts)
    results += s3_results + cassandra_runs(cassandra, sets["cassandra"], opts)
    return results, skipped


def medians(rounds: list[list[RunResult]]) -> list[dict[str, Any]]:
    """Per (reader, mode): the median, min and max images/s over rounds, and the median of the other figures."""
    rows = []
    for i, first in enumerate(rounds[0]):
        runs = [r[i] for r in rounds]
        ips = [r.images_per_s for r in runs]
        rows.append(
            {
                "reader": first.reader,
                "mode": first.mode,
                "images": first.images,
                "images_per_s": statistics.median(ips),
                "min": min(ips),
                "max": max(ips),
                "mb_per_s": statistics.median(r.mb_per_s for r in runs),
                "batch_ms_p50": statistics.median(r.batch_ms_p50 for r in runs),
                "batch_ms_p99": statistics.median(r.batch_ms_p99 for r in runs),
                "cpu_cores": statistics.median(r.cpu_cores for r in runs),
                "verified": all(r.ok for r in runs),
                "problems": [p for r in runs for p in r.problems][:5],
                "settings": first.settings,
            }
        )
    return rows


def ratios(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """The figures the targets are stated in."""
    get = {(r["reader"], r["mode"]): r["images_per_s"] for r in rows}

    def ratio(a: tuple[str, str], b: tuple[str, str]) -> float | None:
        return round(get[a] / get[b], 2) if get.get(a) and get.get(b) else None

    return {
        "cassandra_raw_vs_simple (target >= 4)": ratio(("cassandra", "raw"), ("cassandra-simple", "raw")),
        "cassandra_raw_vs_files": ratio(("cassandra", "raw"), ("files", "raw")),
        "cassandra_train_vs_files_train (target >= 0.9)": ratio(("cassandra", "train"), ("files", "train")),
        "shards_folder_raw_vs_files (target >= 1.0)": ratio(("shards-folder", "raw"), ("files", "raw")),
        "shards_folder_train_vs_files": ratio(("shards-folder", "train"), ("files", "train")),
        "s3_stream_raw_vs_webdataset (target >= 1.5)": ratio(
            ("shards-s3-stream", "raw"), ("shards-s3-webdataset", "raw")
        ),
        "s3_stream_train_vs_webdataset": ratio(("shards-s3-stream", "train"), ("shards-s3-webdataset", "train")),
        "s3_dali_raw_vs_stream": ratio(("shards-s3-dali", "raw"), ("shards-s3-stream", "raw")),
    }


def latency_sweep(
    sets: dict[str, ReadSet],
    where: dict[str, Any],
    cassandra: CassandraSettings,
    s3: S3Settings,
    rtts: list[float],
    depths: list[int],
    batch_size: int,
    repeats: int = 3,
) -> list[dict[str, Any]]:
    """Raw-bytes throughput through a real TCP proxy adding RTT: prefetch depth (Cassandra) and shards in
    flight (S3) against the readers that request nothing ahead; the median of REPEATS runs per point."""
    from imgest.readback.check import cassandra_run, cassandra_simple_run, s3_stream_run, s3_webdataset_run
    from imgest.readback.pipelines import PipelineSpec
    from imgest.services.latency import LatencyProxy

    proxy = LatencyProxy.default()
    proxy.up()
    c_addr = proxy.proxy(
        "cassandra", env_int("IMGEST_PROXY_CASSANDRA_PORT", 29042), f"{cassandra.hosts[0]}:{cassandra.port}"
    )
    s_addr = proxy.proxy("s3", env_int("IMGEST_PROXY_S3_PORT", 29333), (s3.endpoint_url or "").split("://", 1)[-1])
    c_proxied = replace(cassandra, hosts=(c_addr.split(":")[0],), port=int(c_addr.split(":")[1]))
    s_proxied = replace(s3, endpoint_url=f"http://{s_addr}")
    bucket, _, prefix = where["s3"][5:].partition("/")
    spec, opts = PipelineSpec(batch_size, mode="raw"), ReadCheckOptions(batch_size=batch_size)
    rows: list[dict[str, Any]] = []

    def row(rtt: float, depth: int | None, run: Any) -> None:  # RUN() once per repeat; the median is kept
        results = [run() for _ in range(repeats)]
        ips = statistics.median(r.images_per_s for r in results)
        rows.append(
            {
                "rtt_ms": rtt,
                "reader": results[0].reader,
                "depth": depth,
                "images_per_s": ips,
                "min": min(r.images_per_s for r in results),
                "max": max(r.images_per_s for r in results),
                "ok": all(r.ok for r in results),
            }
        )
        log.info("rtt %s ms %s depth %s: %.0f images/s", rtt, results[0].reader, depth, ips)

    cset, sset = sets["cassandra"], sets["s3"]
    for rtt in rtts:
        proxy.set_rtt("cassandra", rtt)
        proxy.set_rtt("s3", rtt)
        row(rtt, None, lambda: cassandra_simple_run(c_proxied, cset, spec))
        row(rtt, None, lambda: s3_webdataset_run(sset, s_proxied, bucket, prefix, spec))
        for depth in depths:
            copts = replace(opts.cassandra, prefetch_batches=depth)
            sopts = replace(opts.s3, parallel_shards=depth)
            row(rtt, depth, lambda c=copts: cassandra_run(c_proxied, cset, spec, c))
            row(rtt, depth, lambda s=sopts: s3_stream_run(sset, s_proxied, bucket, prefix, spec, s))
    return rows


def plot(path: Path, rows: list[dict[str, Any]], sweep: list[dict[str, Any]]) -> None:
    """Readers side by side (raw and train), and throughput against prefetch depth at each added RTT."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5))
    readers = list(dict.fromkeys(r["reader"] for r in rows))
    for k, mode in enumerate(("raw", "train")):
        values = [next((r["images_per_s"] for r in rows if r["reader"] == n and r["mode"] == mode), 0) for n in readers]
        bars = left.bar([i + k * 0.4 for i in range(len(readers))], values, 0.4, label=mode)
        left.bar_label(bars, fmt="%.0f", fontsize=7)
    left.set_xticks([i + 0.2 for i in range(len(readers))], readers, rotation=30, ha="right")
    left.set_ylabel("images/s (median)")
    left.set_title("DALI read throughput, same images")
    left.legend(title="pipeline")
    for reader, style in (("cassandra", "-"), ("shards-s3-stream", "--")):
        for rtt in sorted({s["rtt_ms"] for s in sweep}):
            pts = [(s["depth"], s["images_per_s"]) for s in sweep if s["reader"] == reader and s["rtt_ms"] == rtt]
            if pts:
                right.plot(*zip(*pts, strict=True), style, marker="o", label=f"{reader}, +{rtt:g} ms")
    right.set_xscale("log", base=2)
    right.set_xlabel("prefetch batches (Cassandra) / shards in flight (S3)")
    right.set_ylabel("images/s, raw bytes")
    right.set_title("Latency hiding through a TCP proxy")
    right.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def server_pids() -> list[int]:
    """PIDs of the embedded servers the readers talk to (pinned to the server core)."""
    from imgest.services import CassandraServer, S3Server
    from imgest.services.latency import LatencyProxy

    pids = [s.process.pid() for s in (CassandraServer.default(), S3Server.default(), LatencyProxy.default())]
    return [p for p in pids if p]


def measure_all(
    images: int, rounds: int, rtts: list[float], depths: list[int], batch_size: int, sample: int = 0
) -> dict[str, Any]:
    """Prepare, then every reader ROUNDS times (after a warm-up round) and the latency sweep, pinned."""
    from imgest.readback.pinning import pinned
    from imgest.services import CassandraServer, S3Server
    from imgest.services.latency import LatencyProxy

    services = [CassandraServer.default(), S3Server.default(), *([LatencyProxy.default()] if rtts else [])]
    for service in services:
        service.up()
    cassandra, s3 = CassandraSettings.from_env(), S3Settings.from_env()
    where = prepare(images)
    sets = read_sets(where, cassandra, s3, sample)
    opts = ReadCheckOptions(batch_size=batch_size)
    with pinned(server_pids()) as pinning:
        one_round(sets, where, cassandra, s3, opts)  # warm-up: page cache, JIT of the servers, connections
        runs = [one_round(sets, where, cassandra, s3, opts) for _ in range(rounds)]
        sweep = latency_sweep(sets, where, cassandra, s3, rtts, depths, batch_size) if rtts else []
    rows = medians([r for r, _ in runs])
    return {
        "machine": machine_info(),
        "pinning": pinning,
        "images": {k: len(v) for k, v in sets.items()},
        "sample": sample,
        "batch_size": batch_size,
        "rounds": rounds,
        "readers": rows,
        "skipped": runs[0][1],
        "ratios": ratios(rows),
        "latency_sweep": sweep,
        "latency_kept": kept_under_latency(sweep),
    }


def main(
    json_out: Path,
    plot_out: Path | None,
    images: int,
    rounds: int,
    rtts: list[float],
    depths: list[int],
    batch_size: int = 64,
    sample: int = 0,
) -> dict[str, Any]:
    """Measure, print the table and the target ratios, write JSON (and the plot)."""
    report = measure_all(images, rounds, rtts, depths, batch_size, sample)
    columns = [
        ("reader", "reader"),
        ("mode", "mode"),
        ("images_per_s", "img/s"),
        ("min", "min"),
        ("max", "max"),
        ("mb_per_s", "MB/s"),
        ("batch_ms_p50", "p50 ms"),
        ("batch_ms_p99", "p99 ms"),
        ("cpu_cores", "cpu"),
        ("verified", "verified"),
    ]
    print(describe_machine(report["machine"]))
    print(format_table(report["readers"], columns))
    print(f"pinning: {report['pinning']}")
    for name, value in {**report["ratios"], **report["latency_kept"]}.items():
        print(f"{name}: {value}")
    if report["skipped"]:
        print(f"skipped: {report['skipped']}")
    write_json(json_out, report)
    if plot_out:
        plot(plot_out, report["readers"], report["latency_sweep"])
    return report


def kept_under_latency(sweep: list[dict[str, Any]]) -> dict[str, float | None]:
    """Best throughput at the largest RTT over the best at 0 ms, per latency-hiding reader (target >= 0.8)."""
    out: dict[str, float | None] = {}
    if not sweep:
        return out
    worst = max(s["rtt_ms"] for s in sweep)
    for reader in ("cassandra", "shards-s3-stream", "cassandra-simple", "shards-s3-webdataset"):
        base = max((s["images_per_s"] for s in sweep if s["reader"] == reader and s["rtt_ms"] == 0), default=0)
        slow = max((s["images_per_s"] for s in sweep if s["reader"] == reader and s["rtt_ms"] == worst), default=0)
        out[f"{reader}_kept_at_{worst:g}ms (target >= 0.8 for imgest's)"] = round(slow / base, 2) if base else None
    return out
