"""The DAG's ``read_throughput`` step: read the version just stored back with every reader that applies.

It reads a seeded, class-balanced sample of the train split (``ReadCheckOptions.sample`` images, by default
``defaults.CHECK_SAMPLE``; whole shards for the shard target), or every row when the sample is 0. The report
says which: ``sample`` (requested), ``checked`` (the images of the sample: what each reader read and verified
unless the budget below cut it), ``split_rows``,
``full_read`` and ``balance`` (images per class: min, max and the counts).

It runs within a time budget (``ReadCheckOptions.seconds``, by default ``defaults.CHECK_SECONDS``; in a DAG run of
``defaults.CHECK_SHARE_FROM_IMAGES`` train images or more also ``defaults.CHECK_RUN_SHARE`` of the run): each reader
reads its warm-up and measured window, then on until its rate is steady or its share is spent (imgest.readback.budget).
Every image read is verified; the report says per reader its start-up (``startup_s``, ``warmup_s``) apart from its
steady rate (``steady_rate`` over ``steady_batches``; ``steady`` false with a ``rate_note`` when that is start-up, not
a throughput), what it read (``images``, ``images_verified``), its ``budget_s``, why it stopped (``stop``) and, where
it stopped before its sample's end, ``budget_cut`` with the ``reason``; at the top ``budget_s``, ``seconds`` (from the
check's start to its report), ``budget_cut`` and ``not_steady``.

Where DALI is not installed the readers that need none run in raw mode and the others are listed under
``skipped`` with the reason (imgest.readback.without_dali); where matplotlib is not, no plot is drawn (``plot``
None). The report (JSON and a plot) goes to the work folder and is referenced from the version record: the
``checks`` column of ``dataset_versions`` for Cassandra, a ``checks`` entry of ``manifest.json`` for shards and
files. Any sample that does not hash to its recorded sha256, carries a wrong label, is missing or comes twice
fails the step after the report is written.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgest.core import workdir
from imgest.core.errors import ImgestError
from imgest.core.locks import check_fence
from imgest.core.report import format_table, optional_plot, write_json
from imgest.readback.budget import CheckClock
from imgest.readback.check import ReadCheckOptions, cassandra_runs, files_runs, folder_shard_runs
from imgest.readback.check_s3 import s3_shard_runs
from imgest.readback.measure import RunResult
from imgest.readback.pipelines import dali_missing

if TYPE_CHECKING:
    from imgest.readback.datasets import ReadSet

log = logging.getLogger(__name__)
COLUMNS = [
    ("reader", "reader"),
    ("mode", "mode"),
    ("images", "images"),
    ("passes", "reads"),
    ("startup_s", "startup s"),
    ("steady_rate", "steady img/s"),
    ("steady_batches", "over batches"),
    ("steady_s", "over s"),
    ("least_window_s", "least s"),
    ("steady_word", "steady"),
    ("images_per_s", "wall img/s"),
    ("batch_ms_p50", "p50 ms"),
    ("ok", "verified"),
    ("stop", "stopped"),
]


class ReadBackError(ImgestError):
    """What was read back differs from what was recorded at ingest."""


def _progress(name: str) -> Any:
    def advance(n: int) -> None:
        log.debug("%s: %d more images", name, n)

    return advance


def _log_sample(rs: ReadSet) -> None:
    log.info("read-back of %s: %s", rs.location, rs.sample.summary() if rs.sample else f"{len(rs)} images")


def read_set(target: str, location: str, settings: dict[str, Any], opts: ReadCheckOptions, split: str) -> ReadSet:
    """What the check reads of TARGET at LOCATION: the sample OPTS asks for (every row when it is 0)."""
    from imgest.readback import datasets

    pick = {"sample": opts.sample, "seed": opts.sample_seed}
    if target == "cassandra":
        from imgest.sinks.cassandra.client import cassandra_session

        with cassandra_session(settings["cassandra"]) as session:
            rs = datasets.cassandra_set(session, settings["tables"], settings["dataset"], split=split, **pick)
    elif target == "files":
        rs = datasets.files_set(Path(location), split, **pick)
    else:
        from imgest.sinks.shards.store import open_store

        rs = datasets.shards_set(open_store(location, settings.get("s3")), split, **pick)
    _log_sample(rs)
    return rs


def run_target(
    target: str,
    location: str,
    settings: dict[str, Any],
    opts: ReadCheckOptions,
    split: str = "train",
    clock: CheckClock | None = None,
) -> tuple[list[RunResult], list[str], ReadSet]:
    """Readers of TARGET at LOCATION over the sample OPTS asks for, each within its share of CLOCK (None: no
    budget; its seconds set once the sample's count is known: ReadCheckOptions.budget_for); returns (results,
    skipped, what was read)."""
    rs = read_set(target, location, settings, opts, split)
    if clock is not None:
        images = rs.sample.total if rs.sample else len(rs)
        clock.set_seconds(opts.budget_for(images))
        log.info(
            "read-back budget %.1f s (check_seconds %s, %d %s images, the run so far %s s)",
            clock.seconds,
            opts.seconds,
            images,
            split,
            opts.run_seconds,
        )
    results, skipped = run_readers(target, location, settings, opts, rs, clock)
    return results, skipped, rs


def run_readers(
    target: str, location: str, settings: dict[str, Any], opts: ReadCheckOptions, rs: ReadSet, clock: CheckClock | None
) -> tuple[list[RunResult], list[str]]:
    """Every reader of TARGET over RS, each within its share of CLOCK; (results, skipped). Where DALI cannot be
    imported, the readers that need none run (raw mode) and the others are skipped (imgest.readback.without_dali)."""
    reason = dali_missing()
    if reason is not None:
        from imgest.readback.without_dali import runs_without_dali

        return runs_without_dali(target, location, settings, rs, opts, reason, clock)
    if target == "cassandra":
        skipped: list[str] = []
        return cassandra_runs(settings["cassandra"], rs, opts, clock=clock, skipped=skipped), skipped
    if target == "files":
        return files_runs(rs, opts, clock=clock), []
    if not location.startswith("s3://"):
        return folder_shard_runs(rs, location, opts, clock=clock), []
    bucket, _, prefix = location[5:].partition("/")
    return s3_shard_runs(rs, settings["s3"], bucket, prefix, opts, clock=clock)


def record_check(target: str, location: str, settings: dict[str, Any], version: str, report_path: Path) -> None:
    """Reference the report from the version record (fenced: a process that lost the dataset's lock changes
    nothing): by its copy in the state store when the run state lives there (another host reads the record)."""
    from imgest.core.workarea import shared_location

    if target == "cassandra":
        from imgest.sinks.cassandra.client import cassandra_session

        ks = settings["tables"].keyspace
        check_fence(str(settings.get("dataset", "")))
        with cassandra_session(settings["cassandra"]) as session:
            session.execute(
                f"UPDATE {ks}.dataset_versions SET checks = checks + %s WHERE dataset = %s AND version = %s",
                ({"read_throughput": shared_location(report_path)}, settings["dataset"], version),
            )
        return
    from imgest.sinks.shards.store import open_store

    store = open_store(location, settings.get("s3")) if target == "shards" else None
    manifest_path = Path(location) / workdir.PUBLISHED_MANIFEST
    if store:
        from imgest.sinks.shards.manifest_switch import read_live, switch

        live, version_read = read_live(store)  # the report lands only on the manifest it was read from
        manifest = dict(live or {})
    else:
        manifest = json.loads(manifest_path.read_text())
    manifest["checks"] = {**manifest.get("checks", {}), "read_throughput": shared_location(report_path)}
    check_fence(str(manifest.get("dataset", "")))
    if store:
        switch(store, manifest, version_read)
    else:
        from imgest.sinks.files.write import write_atomic

        write_atomic(manifest_path, json.dumps(manifest, indent=1, sort_keys=True).encode())


def read_throughput_step(
    target: str, location: str, out_dir: Path, settings: dict[str, Any], opts: ReadCheckOptions | None = None
) -> dict[str, Any]:
    """Read a sample of the stored version (every row when OPTS.sample is 0) back with every reader of TARGET, within
    the check's budget (ReadCheckOptions.budget_for); write, record and summarise the report, which says how many
    images were checked, how balanced, and per reader its start-up, its steady rate (and whether it is one) and
    why it stopped where it did."""
    opts = opts or ReadCheckOptions()
    clock = opts.clock()
    results, skipped, rs = run_target(target, location, settings, opts, clock=clock)
    version = rs.version
    rows = [r.to_dict() for r in results]
    sample = rs.sample.to_dict() if rs.sample else {"sample": 0, "checked": len(rs), "full_read": True}
    cut = [f"{r['reader']}/{r['mode']}" for r in rows if r["budget_cut"]]
    unsteady = [f"{r['reader']}/{r['mode']}" for r in rows if not r["steady"]]
    report = {"target": target, "location": location, "version": version, **sample}
    report |= {"budget_s": clock.seconds, "seconds": round(clock.elapsed(), 1), "budget_cut": cut}
    report |= {"warmup_batches": opts.warmup, "window_batches": opts.window, "not_steady": unsteady}
    report |= {"readers": rows, "skipped": skipped}
    json_path = out_dir / workdir.READ_REPORT
    write_json(json_path, report)
    plot_path = optional_plot(out_dir / workdir.READ_PLOT, lambda path: _plot(path, rows))
    _log_report(location, report, rows)
    record_check(target, location, settings, version, json_path)
    bad = [f"{r['reader']}/{r['mode']}: {'; '.join(r['problems'][:3])}" for r in rows if not r["ok"]]
    if bad:
        raise ReadBackError(
            f"read-back of {location} does not match the ingest record ({json_path}): " + " | ".join(bad)
        )
    return {
        "report": str(json_path),
        "plot": str(plot_path) if plot_path else None,  # None: no matplotlib (imgest[plots]) here
        "sample": sample["sample"],
        "checked": sample["checked"],
        "full_read": sample["full_read"],
        # per reader its steady rate (None where it is not one: start-up, never shown as a throughput) and start-up
        "readers": {
            f"{r['reader']}/{r['mode']}": {"steady_rate": r["steady_rate"] if r["steady"] else None, **_startup(r)}
            for r in rows
        },
        "skipped": skipped,
        "budget_s": clock.seconds,
        "seconds": report["seconds"],
        "budget_cut": cut,
        "not_steady": unsteady,
    }


def _startup(row: dict[str, Any]) -> dict[str, Any]:
    return {"startup_s": row["startup_s"], "images": row["images"]}


def _log_report(location: str, report: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """The task log: the table (start-up and steady rate apart), then one line per reader whose rate is not one."""
    table = [{**r, "steady_word": "yes" if r["steady"] else "NO"} for r in rows]
    log.info(
        "read-back of %s in %.1f s (budget %s s; %d warm-up batches, a steady rate over at least %d more; stopped "
        "before the sample's end: %s):\n%s",
        location,
        report["seconds"],
        report["budget_s"] or "no",
        report["warmup_batches"],
        report["window_batches"],
        ", ".join(report["budget_cut"]) or "none",
        format_table(table, COLUMNS),
    )
    for r in rows:
        if not r["steady"]:
            log.warning("%s/%s: %.1f images/s is %s", r["reader"], r["mode"], r["steady_rate"], r["rate_note"])


def _plot(path: Path, rows: list[dict[str, Any]]) -> None:
    from imgest.readback.report_plot import plot_check

    plot_check(path, rows)
