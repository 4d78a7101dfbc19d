"""`imgest bench read`: DALI read throughput from Cassandra, shards (folder and S3) and files, same images.

One generated dataset is stored three ways by the project's own jobs (Cassandra tables, shards in a folder
and on S3, files); every reader then reads the same train rows through the same DALI pipeline, pinned the same
way (servers on one core, the reader on the other), raw bytes and the CPU training pipeline, median of ROUNDS.
A network sweep puts a real TCP proxy (Toxiproxy) between the readers and Cassandra / S3 and adds round trips,
then a bandwidth limit and jitter; the readers whose window sizes itself read several epochs in a row (what a
training run sees: the first epoch grows the window, later ones start from it), optionally over a larger copy of
the dataset (``--sweep-images``: the same images hard-linked under new names, stored on S3 and in Cassandra only)
so that an epoch lasts seconds, not the fraction of a second in which its start-up dominates. One methodology
throughout: a reader's images/s is its epoch rate, the harmonic mean of its batch rates (as the
cassandra-dali-plugin's paper states it), median of the rounds, with the CPU cores the reading process used per
1,000 images/s.
"""

from __future__ import annotations

import json
import logging
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from imgest.bench.pack import link_copies
from imgest.bench.report import describe_machine, format_table, machine_info, write_json
from imgest.core.paths import state_dir
from imgest.core.settings import CassandraSettings, S3Settings, env_int
from imgest.readback.check import ReadCheckOptions
from imgest.readback.datasets import ReadSet
from imgest.readback.measure import RunResult

log = logging.getLogger(__name__)
KEYSPACE = "bench_read"  # one keyspace per dataset size: verify and read-back count every row of a table
ADAPTIVE = ("cassandra", "shards-s3-stream")  # the readers whose default window sizes itself
SWEPT = (*ADAPTIVE, "cassandra-simple", "shards-s3-webdataset")  # the readers of the network sweep (default)
# cassandra-dali-plugin's fn.crs4.cassandra with each preset (make install-peers): imgest.peers.crs4_reader.PRESETS
PLUGIN = ("crs4-plugin-defaults", "crs4-plugin-examples", "crs4-plugin-lfn")


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


def prepare_sweep(images: int, base: dict[str, Any]) -> dict[str, Any]:
    """The sweep's larger dataset: IMAGES train images linked from BASE's sources (see prepare), stored on S3 and
    in Cassandra only (cached in the state folder); returns where each copy is."""
    from imgest.cli import main as cli

    root = state_dir() / "bench" / f"read-sweep-{images}"
    where = {
        "src": root / "src",
        "work": root / "work",
        "s3": f"s3://imgest/bench/read-sweep-{images}",
        "dataset": f"readsweep{images}",
        "keyspace": f"{KEYSPACE}_sweep_{images}",
    }
    marker = root / "prepared.json"
    if marker.is_file():
        return where
    link_copies(Path(base["src"]), root / "src", images)  # every copy its own path and id, the same bytes
    common = [str(where["src"]), "--work-dir", str(where["work"]), "--dataset", where["dataset"]]
    for argv in (
        ["ingest", "shards", *common, "--dest", where["s3"], "--max-count", "500"],
        ["ingest", "cassandra", *common, "--keyspace", where["keyspace"], "--verify"],
    ):
        if cli(argv) != 0:
            raise RuntimeError(f"preparing the sweep dataset failed: imgest {' '.join(argv)}")
    marker.write_text(json.dumps({k: str(v) for k, v in where.items()}))
    return where


def sweep_sets(where: dict[str, Any], cassandra: CassandraSettings, s3: S3Settings) -> dict[str, ReadSet]:
    """Every train row of the sweep dataset's two copies (S3 shards, Cassandra)."""
    from imgest.readback.datasets import cassandra_set, shards_set
    from imgest.sinks.cassandra.client import cassandra_session
    from imgest.sinks.cassandra.schema import TableLayout
    from imgest.sinks.shards.store import open_store

    with cassandra_session(cassandra) as session:
        cset = cassandra_set(session, TableLayout(where["keyspace"]), where["dataset"])
    return {"s3": shards_set(open_store(where["s3"], s3)), "cassandra": cset}


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
    try:  # the PyTorch datasets (imgest[torch]) beside webdataset's own loader
        from imgest.readback.torchcheck import torch_runs

        results += torch_runs(sets, where["s3"], cassandra, s3, opts)
    except ImportError as exc:
        skipped.append(f"torch-shards-s3, torch-cassandra: {exc}")
    return results, skipped


def medians(rounds: list[list[RunResult]]) -> list[dict[str, Any]]:
    """Per (reader, mode): the median, min and max images/s over rounds, and the median of the other figures."""
    rows = []
    for i, first in enumerate(rounds[0]):
        runs = [r[i] for r in rounds]
        ips = [r.epoch_rate for r in runs]
        rows.append(
            {
                "reader": first.reader,
                "mode": first.mode,
                "images": first.images,
                "images_per_s": statistics.median(ips),
                "min": min(ips),
                "max": max(ips),
                "wall_images_per_s": statistics.median(r.images_per_s for r in runs),
                "mb_per_s": statistics.median(r.mb_per_s for r in runs),
                "batch_ms_p50": statistics.median(r.batch_ms_p50 for r in runs),
                "batch_ms_p99": statistics.median(r.batch_ms_p99 for r in runs),
                "cpu_cores": statistics.median(r.cpu_cores for r in runs),
                "cores_per_1k": statistics.median(r.cores_per_1k for r in runs),
                "first_batch_ms": statistics.median(r.first_batch_ms for r in runs),
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


# Published figures the report states beside ours (see docs/readback.md#benchmarks).
ANCHORS = {
    "cassandra-dali-plugin": "more than 20,000 images/s (about 20 Gb/s) with 100 ms added round trip over 25 GbE, "
    "ImageNet, one Python process, 16 prefetch buffers, 8 I/O threads, out-of-order",
    "DALI issue 5551": "5,000 images/s with fn.readers.file and 20,000 with TFRecord, from NVMe",
    "LitData": "5,800-6,700 images/s streaming ImageNet from S3",
}


@dataclass(frozen=True)
class Condition:
    """One network condition of the sweep: an added round trip, optionally with jitter or a bandwidth limit."""

    name: str
    rtt_ms: float
    jitter_ms: float = 0.0
    rate_kb_s: int = 0  # 0: no bandwidth limit

    def apply(self, proxy: Any, names: list[str]) -> None:
        for name in names:
            proxy.set_rtt(name, self.rtt_ms, jitter_ms=self.jitter_ms)
            proxy.set_bandwidth(name, self.rate_kb_s)


def conditions(rtts: list[float], bandwidth_mb_s: float, jitter_ms: float, limited_rtt: float) -> list[Condition]:
    """The added round trips, then a bandwidth-limited and a jittery case at LIMITED_RTT (0 values: left out).
    Toxiproxy's bandwidth toxic limits each TCP connection, so a reader with more connections gets more."""
    out = [Condition(f"{rtt:g} ms", rtt) for rtt in rtts]
    if bandwidth_mb_s > 0:
        name = f"{limited_rtt:g} ms, {bandwidth_mb_s:g} MB/s per connection"  # Toxiproxy limits each connection
        out.append(Condition(name, limited_rtt, 0, int(bandwidth_mb_s * 1000)))
    if jitter_ms > 0:
        out.append(Condition(f"{limited_rtt:g} ± {jitter_ms:g} ms", limited_rtt, jitter_ms))
    return out


def latency_sweep(
    sets: dict[str, ReadSet],
    where: dict[str, Any],
    cassandra: CassandraSettings,
    s3: S3Settings,
    conds: list[Condition],
    depths: list[int],
    batch_size: int,
    repeats: int = 3,
    epochs: int = 2,
    window_sets: dict[str, ReadSet] | None = None,
    window_where: dict[str, Any] | None = None,
    readers: tuple[str, ...] = SWEPT,
) -> list[dict[str, Any]]:
    """Raw-bytes epoch rate (harmonic mean of batch rates) through a real TCP proxy under each condition: imgest's
    readers with their default (adaptive) window, EPOCHS epochs in a row per run (the first grown from the slow
    start, the later ones from the window the one before left, as in a training run), with fixed windows of
    DEPTHS, and the readers that request nothing ahead; the median of REPEATS runs per point and epoch (and of
    all epochs together: "all"), with the CPU cores per 1,000 images/s. The windowed readers read WINDOW_SETS
    (stored at WINDOW_WHERE; by default SETS), the readers that request nothing ahead read SETS; only READERS."""
    from imgest.readback.check import (
        cassandra_epochs,
        cassandra_run,
        cassandra_simple_run,
        s3_stream_epochs,
        s3_stream_run,
        s3_webdataset_run,
    )
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
    w_bucket, _, w_prefix = (window_where or where)["s3"][5:].partition("/")
    spec = PipelineSpec(batch_size, mode="raw", verify_after=True)  # time run() alone, as the plugin does
    opts = ReadCheckOptions(batch_size=batch_size)
    rows: list[dict[str, Any]] = []

    def row(cond: Condition, depth: int | None, repeats_: list[list[RunResult]]) -> None:  # medians kept
        adaptive = depth is None and repeats_[0][0].reader in ADAPTIVE
        base = {
            "condition": cond.name,
            "rtt_ms": cond.rtt_ms,
            "jitter_ms": cond.jitter_ms,
            "bandwidth_mb_s": cond.rate_kb_s / 1000,
            "reader": repeats_[0][0].reader,
            "window": "adaptive" if adaptive else depth,
        }
        for k in range(len(repeats_[0])):
            rows.append({**base, **epoch_row(k, [r[k] for r in repeats_])})
            log.info("%s %s window %s, %s epoch: %.0f images/s", *[rows[-1][f] for f in EPOCH_LOG])
        if len(repeats_[0]) > 1:
            rows.append({**base, **all_epochs_row(repeats_)})
            log.info("%s %s window %s, %s epochs: %.0f images/s", *[rows[-1][f] for f in EPOCH_LOG])

    cset, sset = sets["cassandra"], sets["s3"]
    wc, ws = (window_sets or sets)["cassandra"], (window_sets or sets)["s3"]
    runs = {
        "cassandra": lambda: cassandra_epochs(c_proxied, wc, spec, opts.cassandra, epochs),
        "shards-s3-stream": lambda: s3_stream_epochs(ws, s_proxied, w_bucket, w_prefix, spec, opts.s3, epochs),
        "cassandra-simple": lambda: [cassandra_simple_run(c_proxied, cset, spec)],
        "shards-s3-webdataset": lambda: [s3_webdataset_run(sset, s_proxied, bucket, prefix, spec)],
    }
    runs.update(plugin_runs(c_proxied, cset, wc, spec, epochs))
    points: list[tuple[int | None, Any]] = [(None, run) for name, run in runs.items() if name in readers]
    for depth in depths:
        copts = replace(opts.cassandra, prefetch_buffers=depth)
        sopts = replace(opts.s3, parallel_shards=depth)
        if "cassandra" in readers:
            points.append((depth, lambda c=copts: [cassandra_run(c_proxied, wc, spec, c)]))
        if "shards-s3-stream" in readers:
            points.append((depth, lambda s=sopts: [s3_stream_run(ws, s_proxied, w_bucket, w_prefix, spec, s)]))
    # Every round visits every condition in turn (not all rounds of one condition, then the next): a machine whose
    # speed drifts during the sweep (a shared host) shifts every condition alike, and the ratios to 0 ms hold.
    results: dict[tuple[int, int], list[list[RunResult]]] = {}
    for round_ in range(repeats):
        for c, cond in enumerate(conds):
            cond.apply(proxy, ["cassandra", "s3"])
            for p, (depth, run) in enumerate(points):
                got = run()
                results.setdefault((c, p), []).append(got)
                rates = ", ".join(f"{r.epoch_rate:.0f}" for r in got)
                window = "adaptive" if depth is None else depth
                log.info(
                    "round %d/%d, %s, %s window %s: %s images/s",
                    round_ + 1,
                    repeats,
                    cond.name,
                    got[0].reader,
                    window,
                    rates,
                )
    for c, cond in enumerate(conds):
        for p, (depth, _) in enumerate(points):
            row(cond, depth, results[(c, p)])
    Condition("0 ms", 0).apply(proxy, ["cassandra", "s3"])
    return rows


def plugin_runs(cassandra: CassandraSettings, small: ReadSet, large: ReadSet, spec: Any, epochs: int) -> dict[str, Any]:
    """The plugin's reader per preset for the sweep: the presets that request ahead read LARGE for EPOCHS epochs
    in a row (one pipeline, as in training); its operator defaults (one buffer ahead) read SMALL, once, as the
    readers that request nothing ahead do."""
    from imgest.peers.crs4_reader import PRESETS, crs4_epochs

    return {
        "crs4-plugin-defaults": lambda: crs4_epochs(cassandra, small, spec, PRESETS["defaults"], 1),
        "crs4-plugin-examples": lambda: crs4_epochs(cassandra, large, spec, PRESETS["examples"], epochs),
        "crs4-plugin-lfn": lambda: crs4_epochs(cassandra, large, spec, PRESETS["lfn"], epochs),
    }


EPOCH_NAMES = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth")
EPOCH_LOG = ("condition", "reader", "window", "epoch", "images_per_s")


def epoch_name(k: int) -> str:
    """'first', 'second', ... for epoch K (from 0)."""
    return EPOCH_NAMES[k] if k < len(EPOCH_NAMES) else f"{k + 1}th"


def epoch_row(k: int, results: list[RunResult]) -> dict[str, Any]:
    """Epoch K over the rounds: the median round's figures (by epoch rate), min, max and the median steady rate."""
    mid = sorted(results, key=lambda r: r.epoch_rate)[len(results) // 2]
    return {
        "epoch": epoch_name(k),
        "images": mid.images,
        "images_per_s": mid.epoch_rate,
        "steady_images_per_s": statistics.median(r.steady_rate for r in results),
        "first_batch_ms": statistics.median(r.first_batch_ms for r in results),
        "min": min(r.epoch_rate for r in results),
        "max": max(r.epoch_rate for r in results),
        "wall_images_per_s": mid.images_per_s,
        "mb_per_s": mid.mb_per_s,
        "cpu_cores": mid.cpu_cores,
        "cores_per_1k": mid.cores_per_1k,
        "ok": all(r.ok for r in results),
        "problems": [p for r in results for p in r.problems][:3],
        "settings": mid.settings,
    }


def all_epochs_row(rounds: list[list[RunResult]]) -> dict[str, Any]:
    """Every epoch of a round together (the harmonic mean of its epochs' rates: they read as many images each, so
    this is the images over the time spent in run() over the run), the median of the rounds."""
    rates = [statistics.harmonic_mean([r.epoch_rate for r in epochs]) for epochs in rounds]
    ok = all(r.ok for epochs in rounds for r in epochs)
    return {
        "epoch": "all",
        "images": sum(r.images for r in rounds[0]),
        "images_per_s": round(statistics.median(rates), 1),
        "steady_images_per_s": None,
        "first_batch_ms": None,
        "min": round(min(rates), 1),
        "max": round(max(rates), 1),
        "ok": ok,
        "problems": [p for epochs in rounds for r in epochs for p in r.problems][:3],
        "settings": {"epochs": len(rounds[0])},
    }


def kept_under_latency(sweep: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per reader and window, each condition's images/s over the same reader's at 0 ms (the targets' figure)."""
    zeros = [s for s in sweep if s["condition"] == "0 ms"]
    base = {(s["reader"], s["window"], s["epoch"]): s["images_per_s"] for s in zeros}
    steady = {(s["reader"], s["window"], s["epoch"]): s.get("steady_images_per_s") for s in zeros}
    out = []
    for s in sweep:
        zero = base.get((s["reader"], s["window"], s["epoch"]))
        steady_zero, steady_now = steady.get((s["reader"], s["window"], s["epoch"])), s.get("steady_images_per_s")
        out.append(
            {
                "reader": s["reader"],
                "window": s["window"],
                "epoch": s["epoch"],
                "condition": s["condition"],
                "images_per_s": s["images_per_s"],
                "vs_0ms": round(s["images_per_s"] / zero, 2) if zero else None,
                "steady_images_per_s": steady_now,
                "steady_vs_0ms": round(steady_now / steady_zero, 2) if steady_zero and steady_now else None,
            }
        )
    return out


def targets(kept: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets: default options keep >= 0.85 of the 0 ms rate at 50 ms and >= 0.75 at 100 ms (each
    epoch of the adaptive readers: the first, grown from the slow start, and the later ones, and all of them
    together); the whole epoch's rate is the target's figure, the second half's (steady state) is stated beside
    it."""
    out: dict[str, Any] = {}
    for reader in ADAPTIVE:
        for epoch in dict.fromkeys(k["epoch"] for k in kept if k["reader"] == reader and k["window"] == "adaptive"):
            for cond, goal in (("50 ms", 0.85), ("100 ms", 0.75)):
                key = (reader, "adaptive", epoch, cond)
                row = next((k for k in kept if (k["reader"], k["window"], k["epoch"], k["condition"]) == key), None)
                if row is not None and row["vs_0ms"] is not None:
                    what = "all epochs" if epoch == "all" else f"{epoch} epoch"
                    out[f"{reader} default, {what}, at {cond} (target >= {goal})"] = {
                        "kept": row["vs_0ms"],
                        "met": row["vs_0ms"] >= goal,
                        "steady_state_kept": row.get("steady_vs_0ms"),
                    }
    return out


def anchors(sweep: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each published figure beside the comparable one of this run."""

    def at(reader: str, cond: str) -> float | None:
        return next(
            (
                s["images_per_s"]
                for s in sweep
                if s["reader"] == reader
                and s["condition"] == cond
                and s["window"] in ("adaptive", None)
                and s["epoch"] == "second"
            ),
            None,
        )

    return [
        {
            "anchor": "cassandra-dali-plugin",
            "theirs": ANCHORS["cassandra-dali-plugin"],
            "ours": f"cassandra (default window, second epoch) at 100 ms: {at('cassandra', '100 ms')} images/s "
            "from one process on 2 shared cores, loopback through Toxiproxy",
        },
        {
            "anchor": "DALI issue 5551",
            "theirs": ANCHORS["DALI issue 5551"],
            "ours": "files / shards-folder: see the readers table of `imgest bench read` (docs/bench/read-run2.json)",
        },
        {
            "anchor": "LitData",
            "theirs": ANCHORS["LitData"],
            "ours": "shards-s3-stream (default window, second epoch) at 0 ms: "
            f"{at('shards-s3-stream', '0 ms')} images/s, at 50 ms: {at('shards-s3-stream', '50 ms')}",
        },
    ]


def plot(path: Path, rows: list[dict[str, Any]], sweep: list[dict[str, Any]]) -> None:
    """Readers side by side (raw and train, when measured); images/s of each reader per network condition and
    the share of its 0 ms rate it keeps (when swept)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (1 if rows else 0) + (2 if sweep else 0)
    fig, axes = plt.subplots(1, panels, figsize=(7 * panels, 5), squeeze=False)
    axes = list(axes[0])
    if rows:
        _plot_readers(axes.pop(0), rows)
    if sweep:
        _plot_sweep(axes[0], axes[1], sweep)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_readers(ax: Any, rows: list[dict[str, Any]]) -> None:
    readers = list(dict.fromkeys(r["reader"] for r in rows))
    for k, mode in enumerate(("raw", "train")):
        values = [next((r["images_per_s"] for r in rows if r["reader"] == n and r["mode"] == mode), 0) for n in readers]
        bars = ax.bar([i + k * 0.4 for i in range(len(readers))], values, 0.4, label=mode)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks([i + 0.2 for i in range(len(readers))], readers, rotation=30, ha="right")
    ax.set_ylabel("images/s (harmonic mean of batch rates, median)")
    ax.set_title("DALI read throughput, same images")
    ax.legend(title="pipeline")


def _plot_sweep(left: Any, right: Any, sweep: list[dict[str, Any]]) -> None:
    conds = list(dict.fromkeys(s["condition"] for s in sweep))
    lines = list(dict.fromkeys((s["reader"], s["window"], s["epoch"]) for s in sweep))
    kept = {(k["reader"], k["window"], k["epoch"], k["condition"]): k["vs_0ms"] for k in kept_under_latency(sweep)}
    width = 0.8 / max(1, len(lines))
    for j, (reader, window, epoch) in enumerate(lines):
        label = reader if window is None else f"{reader}, {'fixed ' if window != 'adaptive' else ''}{window} window"
        label += (", all epochs" if epoch == "all" else f", {epoch} epoch") if window == "adaptive" else ""
        pts = [
            next(
                (
                    s["images_per_s"]
                    for s in sweep
                    if (s["reader"], s["window"], s["epoch"], s["condition"]) == (reader, window, epoch, c)
                ),
                0,
            )
            for c in conds
        ]
        left.plot(range(len(conds)), pts, marker="o", label=label)
        ratios_ = [kept.get((reader, window, epoch, c)) or 0 for c in conds]
        right.bar([i + j * width for i in range(len(conds))], ratios_, width, label=label)
    left.set_xticks(range(len(conds)), conds, rotation=20, ha="right")
    left.set_ylabel("images/s, raw bytes (epoch rate, median of rounds)")
    left.set_title("Readers through Toxiproxy: " + ", ".join(conds[1:] if len(conds) > 1 else conds))
    left.set_ylim(bottom=0)  # from zero: a loss of a few percent looks like one
    left.legend(fontsize=7, loc="lower left")
    right.set_xticks([i + 0.4 - width / 2 for i in range(len(conds))], conds, rotation=20, ha="right")
    for goal in (0.85, 0.75):
        right.axhline(goal, color="grey", linestyle=":", linewidth=1)
    right.set_ylabel("share of the reader's 0 ms rate")
    right.set_title("Kept under latency (targets 0.85 at 50 ms, 0.75 at 100 ms)")
    right.legend(fontsize=7, loc="lower left")


def server_pids() -> list[int]:
    """PIDs of the embedded servers the readers talk to (pinned to the server core)."""
    from imgest.services import CassandraServer, S3Server
    from imgest.services.latency import LatencyProxy

    pids = [s.process.pid() for s in (CassandraServer.default(), S3Server.default(), LatencyProxy.default())]
    return [p for p in pids if p]


def measure_all(
    images: int,
    rounds: int,
    conds: list[Condition],
    depths: list[int],
    batch_size: int,
    sample: int = 0,
    sweep_only: bool = False,
    epochs: int = 3,
    sweep_images: int = 0,
    readers: tuple[str, ...] = SWEPT,
) -> dict[str, Any]:
    """Prepare, then every reader ROUNDS times (after a warm-up round; not with SWEEP_ONLY) and the network
    sweep (ROUNDS repeats per point, the conditions in turn within each, EPOCHS epochs per run of the adaptive
    readers, which read a dataset of SWEEP_IMAGES when larger than IMAGES), pinned."""
    from imgest.readback.pinning import pinned
    from imgest.services import CassandraServer, S3Server
    from imgest.services.latency import LatencyProxy

    services = [CassandraServer.default(), S3Server.default(), *([LatencyProxy.default()] if conds else [])]
    for service in services:
        service.up()
    cassandra, s3 = CassandraSettings.from_env(), S3Settings.from_env()
    where = prepare(images)
    sets = read_sets(where, cassandra, s3, sample)
    window_where = prepare_sweep(sweep_images, where) if conds and sweep_images > images else where
    window_sets = sweep_sets(window_where, cassandra, s3) if window_where is not where else sets
    opts = ReadCheckOptions(batch_size=batch_size)
    runs: list[tuple[list[RunResult], list[str]]] = []
    from imgest.bench.quiet import QuietWatch

    with QuietWatch(server_pids()) as watch, pinned(server_pids()) as pinning:
        if not sweep_only:
            one_round(sets, where, cassandra, s3, opts)  # warm-up: page cache, JIT of the servers, connections
            runs = [one_round(sets, where, cassandra, s3, opts) for _ in range(rounds)]
        sweep = (
            latency_sweep(
                sets,
                where,
                cassandra,
                s3,
                conds,
                depths,
                batch_size,
                rounds,
                epochs,
                window_sets,
                window_where,
                readers,
            )
            if conds
            else []
        )
    rows = medians([r for r, _ in runs]) if runs else []
    kept = kept_under_latency(sweep)
    met = targets(kept)
    if not watch.result.quiet:  # a target is only met on a quiet machine
        met = {name: {**t, "met": False, "not_quiet": True} for name, t in met.items()}
    return {
        "machine": machine_info(),
        "quiet": watch.result.to_dict(),
        "pinning": pinning,
        "method": "images/s is the epoch rate: the harmonic mean of the batch rates (each batch's images over the "
        "time its pipeline run() took), median of the rounds; cpu_cores is the reading process's CPU time over the "
        "epoch's wall time, cores_per_1k that per 1,000 images/s",
        "images": {k: len(v) for k, v in sets.items()},
        "sweep_images": {k: len(v) for k, v in window_sets.items() if k in ("s3", "cassandra")},
        "sweep_epochs": epochs,
        "sweep_note": "the adaptive readers (window 'adaptive', and fixed --depths) read sweep_images per epoch, "
        "EPOCHS epochs in a row per round (epoch 'all': the harmonic mean of a round's epoch rates, median of the "
        "rounds); the readers that request nothing ahead (cassandra-simple, shards-s3-webdataset) read `images`",
        "sample": sample,
        "batch_size": batch_size,
        "rounds": rounds,
        "readers": rows,
        "skipped": runs[0][1] if runs else [],
        "ratios": ratios(rows) if rows else {},
        "conditions": [c.__dict__ for c in conds],
        "latency_sweep": sweep,
        "latency_kept": kept,
        "targets": met,
        "anchors": anchors(sweep),
    }


def main(
    json_out: Path,
    plot_out: Path | None,
    images: int,
    rounds: int,
    conds: list[Condition],
    depths: list[int],
    batch_size: int = 64,
    sample: int = 0,
    sweep_only: bool = False,
    epochs: int = 3,
    sweep_images: int = 0,
    readers: tuple[str, ...] = SWEPT,
) -> dict[str, Any]:
    """Measure, print the tables, the target ratios and the anchors, write JSON (and the plot)."""
    report = measure_all(images, rounds, conds, depths, batch_size, sample, sweep_only, epochs, sweep_images, readers)
    print(describe_machine(report["machine"]))
    from imgest.bench.quiet import Quietness

    print(Quietness.from_dict(report["quiet"]).describe())
    if report["readers"]:
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
            ("cores_per_1k", "cpu/1k img/s"),
            ("verified", "verified"),
        ]
        print(format_table(report["readers"], columns))
    if report["latency_sweep"]:
        columns = [
            ("condition", "condition"),
            ("reader", "reader"),
            ("window", "window"),
            ("epoch", "epoch"),
            ("images", "images"),
            ("images_per_s", "img/s"),
            ("steady_images_per_s", "2nd half"),
            ("first_batch_ms", "1st batch ms"),
            ("min", "min"),
            ("max", "max"),
            ("cpu_cores", "cpu"),
            ("cores_per_1k", "cpu/1k img/s"),
            ("ok", "verified"),
        ]
        print(format_table(report["latency_sweep"], columns))
    print(f"pinning: {report['pinning']}")
    for name, value in {**report["ratios"], **report["targets"]}.items():
        print(f"{name}: {value}")
    for a in report["anchors"]:
        print(f"{a['anchor']}: theirs {a['theirs']}; ours {a['ours']}")
    if report["skipped"]:
        print(f"skipped: {report['skipped']}")
    write_json(json_out, report)
    if plot_out:
        plot(plot_out, report["readers"], report["latency_sweep"])
    return report
