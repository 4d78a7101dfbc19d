"""The DAG's ``read_throughput`` step: read the version just stored back with every reader that applies.

The report (JSON and a plot) goes to the work folder and is referenced from the version record: the
``checks`` column of ``dataset_versions`` for Cassandra, a ``checks`` entry of ``manifest.json`` for shards and
files. Any sample that does not hash to its recorded sha256, carries a wrong label, is missing or comes twice
fails the step after the report is written.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from imgest.bench.report import format_table, write_json
from imgest.core import workdir
from imgest.core.errors import ImgestError
from imgest.readback.check import (
    ReadCheckOptions,
    cassandra_runs,
    files_runs,
    folder_shard_runs,
    s3_shard_runs,
)
from imgest.readback.measure import RunResult

log = logging.getLogger(__name__)
COLUMNS = [
    ("reader", "reader"),
    ("mode", "mode"),
    ("images", "images"),
    ("images_per_s", "img/s"),
    ("mb_per_s", "MB/s"),
    ("batch_ms_p50", "p50 ms"),
    ("batch_ms_p99", "p99 ms"),
    ("ok", "verified"),
]


class ReadBackError(ImgestError):
    """What was read back differs from what was recorded at ingest."""


def _progress(name: str) -> Any:
    def advance(n: int) -> None:
        log.debug("%s: %d more images", name, n)

    return advance


def run_target(
    target: str, location: str, settings: dict[str, Any], opts: ReadCheckOptions, split: str = "train"
) -> tuple[list[RunResult], list[str], str]:
    """Readers of TARGET at LOCATION; returns (results, skipped, version)."""
    from imgest.readback import datasets

    if target == "cassandra":
        from imgest.sinks.cassandra.client import cassandra_session

        with cassandra_session(settings["cassandra"]) as session:
            rs = datasets.cassandra_set(session, settings["tables"], settings["dataset"], split=split)
        return cassandra_runs(settings["cassandra"], rs, opts), [], rs.version
    if target == "files":
        rs = datasets.files_set(Path(location), split)
        return files_runs(rs, opts), [], rs.version
    from imgest.sinks.shards.store import open_store

    rs = datasets.shards_set(open_store(location, settings.get("s3")), split)
    if not location.startswith("s3://"):
        return folder_shard_runs(rs, location, opts), [], ""
    bucket, _, prefix = location[5:].partition("/")
    results, skipped = s3_shard_runs(rs, settings["s3"], bucket, prefix, opts)
    return results, skipped, ""


def record_check(target: str, location: str, settings: dict[str, Any], version: str, report_path: Path) -> None:
    """Reference the report from the version record."""
    if target == "cassandra":
        from imgest.sinks.cassandra.client import cassandra_session

        ks = settings["tables"].keyspace
        with cassandra_session(settings["cassandra"]) as session:
            session.execute(
                f"UPDATE {ks}.dataset_versions SET checks = checks + %s WHERE dataset = %s AND version = %s",
                ({"read_throughput": str(report_path)}, settings["dataset"], version),
            )
        return
    from imgest.sinks.shards.store import open_store

    store = open_store(location, settings.get("s3")) if target == "shards" else None
    manifest_path = Path(location) / workdir.PUBLISHED_MANIFEST
    manifest = store.read_manifest() if store else json.loads(manifest_path.read_text())
    manifest["checks"] = {**manifest.get("checks", {}), "read_throughput": str(report_path)}
    if store:
        store.write_manifest(manifest)
    else:
        from imgest.sinks.files.write import write_atomic

        write_atomic(manifest_path, json.dumps(manifest, indent=1, sort_keys=True).encode())


def read_throughput_step(
    target: str, location: str, out_dir: Path, settings: dict[str, Any], opts: ReadCheckOptions | None = None
) -> dict[str, Any]:
    """Read the stored version back with every reader of TARGET; write, record and summarise the report."""
    opts = opts or ReadCheckOptions()
    results, skipped, version = run_target(target, location, settings, opts)
    rows = [r.to_dict() for r in results]
    report = {"target": target, "location": location, "version": version, "readers": rows, "skipped": skipped}
    json_path, plot_path = out_dir / workdir.READ_REPORT, out_dir / workdir.READ_PLOT
    write_json(json_path, report)
    _plot(plot_path, rows)
    log.info("read-back of %s:\n%s", location, format_table(rows, COLUMNS))
    record_check(target, location, settings, version, json_path)
    bad = [f"{r['reader']}/{r['mode']}: {'; '.join(r['problems'][:3])}" for r in rows if not r["ok"]]
    if bad:
        raise ReadBackError(
            f"read-back of {location} does not match the ingest record ({json_path}): " + " | ".join(bad)
        )
    return {
        "report": str(json_path),
        "plot": str(plot_path),
        "readers": {f"{r['reader']}/{r['mode']}": r["images_per_s"] for r in rows},
        "skipped": skipped,
    }


def _plot(path: Path, rows: list[dict[str, Any]]) -> None:
    from imgest.bench.report import bar_chart

    readers = list(dict.fromkeys(r["reader"] for r in rows))
    series = {
        mode: [next((r["images_per_s"] for r in rows if r["reader"] == n and r["mode"] == mode), 0.0) for n in readers]
        for mode in dict.fromkeys(r["mode"] for r in rows)
    }
    bar_chart(path, "Read-back throughput (images/s, verified)", readers, series, "images/s")
