"""The read benchmarks' network sweep: readers through Toxiproxy under added round trips, a bandwidth limit and
jitter, several epochs in a row; per epoch the medians of the rounds, and the share of the 0 ms rate each keeps
against the targets."""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, replace
from typing import Any

from imgest.core.settings import CassandraSettings, S3Settings, env_int
from imgest.readback.check import ReadCheckOptions
from imgest.readback.datasets import ReadSet
from imgest.readback.measure import RunResult

log = logging.getLogger(__name__)


ADAPTIVE = ("cassandra", "shards-s3-stream")  # the readers whose default window sizes itself


SWEPT = (*ADAPTIVE, "cassandra-simple", "shards-s3-webdataset")  # the readers of the network sweep (default)


# cassandra-dali-plugin's fn.crs4.cassandra with each preset (make install-peers): imgest.peers.crs4_reader.PRESETS
PLUGIN = ("crs4-plugin-defaults", "crs4-plugin-examples", "crs4-plugin-lfn")


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
    from imgest.readback.pipelines import PipelineSpec

    proxy, c_proxied, s_proxied = _proxied(cassandra, s3)
    spec = PipelineSpec(batch_size, mode="raw", verify_after=True)  # time run() alone, as the plugin does
    opts = ReadCheckOptions(batch_size=batch_size)
    window = (window_sets or sets, window_where or where)
    points = _points(sets, where, *window, (c_proxied, s_proxied), spec, opts, epochs, depths, readers)
    results = _rounds(proxy, conds, points, repeats)
    rows: list[dict[str, Any]] = []
    for c, cond in enumerate(conds):
        for p, (depth, _) in enumerate(points):
            rows += _point_rows(cond, depth, results[(c, p)])
    Condition("0 ms", 0).apply(proxy, ["cassandra", "s3"])
    return rows


def _proxied(cassandra: CassandraSettings, s3: S3Settings) -> tuple[Any, CassandraSettings, S3Settings]:
    """Toxiproxy started with a proxy before Cassandra and one before S3; the settings that go through them."""
    from imgest.services.latency import LatencyProxy

    proxy = LatencyProxy.default()
    proxy.up()
    c_addr = proxy.proxy(
        "cassandra", env_int("IMGEST_PROXY_CASSANDRA_PORT", 29042), f"{cassandra.hosts[0]}:{cassandra.port}"
    )
    s_addr = proxy.proxy("s3", env_int("IMGEST_PROXY_S3_PORT", 29333), (s3.endpoint_url or "").split("://", 1)[-1])
    c_proxied = replace(cassandra, hosts=(c_addr.split(":")[0],), port=int(c_addr.split(":")[1]))
    s_proxied = replace(s3, endpoint_url=f"http://{s_addr}")
    return proxy, c_proxied, s_proxied


def _points(
    sets: dict[str, ReadSet],
    where: dict[str, Any],
    window_sets: dict[str, ReadSet],
    window_where: dict[str, Any],
    proxied: tuple[CassandraSettings, S3Settings],
    spec: Any,
    opts: ReadCheckOptions,
    epochs: int,
    depths: list[int],
    readers: tuple[str, ...],
) -> list[tuple[int | None, Any]]:
    """The sweep's points: (fixed window or None, a run returning one result per epoch) for each of READERS."""
    from imgest.readback.check import cassandra_epochs, cassandra_run, cassandra_simple_run
    from imgest.readback.check_s3 import s3_stream_epochs, s3_stream_run, s3_webdataset_run

    c_proxied, s_proxied = proxied
    bucket, _, prefix = where["s3"][5:].partition("/")
    w_bucket, _, w_prefix = window_where["s3"][5:].partition("/")
    cset, sset = sets["cassandra"], sets["s3"]
    wc, ws = window_sets["cassandra"], window_sets["s3"]
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
    return points


def _rounds(
    proxy: Any, conds: list[Condition], points: list[tuple[int | None, Any]], repeats: int
) -> dict[tuple[int, int], list[list[RunResult]]]:
    """Every point under every condition, REPEATS times; per (condition, point) each round's results.

    Every round visits every condition in turn (not all rounds of one condition, then the next): a machine whose
    speed drifts during the sweep (a shared host) shifts every condition alike, and the ratios to 0 ms hold."""
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
    return results


def _point_rows(cond: Condition, depth: int | None, repeats_: list[list[RunResult]]) -> list[dict[str, Any]]:
    """One point's rows under COND: one per epoch (the medians of the rounds) and, with several, all together."""
    adaptive = depth is None and repeats_[0][0].reader in ADAPTIVE
    base = {
        "condition": cond.name,
        "rtt_ms": cond.rtt_ms,
        "jitter_ms": cond.jitter_ms,
        "bandwidth_mb_s": cond.rate_kb_s / 1000,
        "reader": repeats_[0][0].reader,
        "window": "adaptive" if adaptive else depth,
    }
    rows = []
    for k in range(len(repeats_[0])):
        rows.append({**base, **epoch_row(k, [r[k] for r in repeats_])})
        log.info("%s %s window %s, %s epoch: %.0f images/s", *[rows[-1][f] for f in EPOCH_LOG])
    if len(repeats_[0]) > 1:
        rows.append({**base, **all_epochs_row(repeats_)})
        log.info("%s %s window %s, %s epochs: %.0f images/s", *[rows[-1][f] for f in EPOCH_LOG])
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
        "steady_images_per_s": statistics.median(r.second_half_rate for r in results),
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
