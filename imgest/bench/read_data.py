"""The read benchmarks' datasets: one generated dataset stored three ways (Cassandra, shards in a folder and on
S3, files) by the project's own ingest command, a larger copy for the network sweep, and the rows each reader
reads. The ingest command is handed in by the CLI (``Ingest``): a benchmark never imports the command line."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from imgest.bench.pack_data import link_copies
from imgest.core.paths import state_dir
from imgest.core.settings import CassandraSettings, S3Settings
from imgest.readback.datasets import ReadSet

# `imgest ARGV...` for an ingest command (imgest.cli.ingest.run_ingest): returns its exit status.
Ingest = Callable[[Sequence[str]], int]
KEYSPACE = "bench_read"  # one keyspace per dataset size: verify and read-back count every row of a table


def prepare(images: int, ingest: Ingest) -> dict[str, Any]:
    """Generate and store the dataset three ways with INGEST (cached in the state folder); returns where each
    copy is."""
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
    for done, argv in [] if marker.is_file() and stores_hold(where) else steps:
        if done is not None and done.is_file():
            continue
        if ingest([*argv[:2], *argv[2:], "--max-count", "500"] if argv[1] == "shards" else argv) != 0:
            raise RuntimeError(f"preparing the benchmark dataset failed: imgest {' '.join(argv)}")
    marker.write_text(json.dumps({k: str(v) for k, v in where.items()}))
    return where


def stores_hold(where: dict[str, Any]) -> bool:
    """Whether the servers still hold WHERE's copies (a complete version in its keyspace, a manifest under its S3
    prefix): a state folder outlives a server's data (a reset node, a wiped bucket), and its marker alone would
    send the readers to tables that are gone."""
    from imgest.sinks.cassandra.client import cassandra_session
    from imgest.sinks.cassandra.versions import records
    from imgest.sinks.shards.store import open_store

    try:
        with cassandra_session(CassandraSettings.from_env()) as session:
            known = session.execute(
                "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s", (where["keyspace"],)
            ).one()
            if known is None or not any(r.status == "complete" for r in records(session, where["keyspace"])):
                return False
        return open_store(where["s3"], S3Settings.from_env()).read_manifest() is not None
    except Exception:  # any doubt: the ingest commands run again (they skip what is stored)
        return False


def prepare_sweep(images: int, base: dict[str, Any], ingest: Ingest) -> dict[str, Any]:
    """The sweep's larger dataset: IMAGES train images linked from BASE's sources (see prepare), stored on S3 and
    in Cassandra only with INGEST (cached in the state folder); returns where each copy is."""

    root = state_dir() / "bench" / f"read-sweep-{images}"
    where = {
        "src": root / "src",
        "work": root / "work",
        "s3": f"s3://imgest/bench/read-sweep-{images}",
        "dataset": f"readsweep{images}",
        "keyspace": f"{KEYSPACE}_sweep_{images}",
    }
    marker = root / "prepared.json"
    if marker.is_file() and stores_hold(where):
        return where
    link_copies(Path(base["src"]), root / "src", images)  # every copy its own path and id, the same bytes
    common = [str(where["src"]), "--work-dir", str(where["work"]), "--dataset", where["dataset"]]
    for argv in (
        ["ingest", "shards", *common, "--dest", where["s3"], "--max-count", "500"],
        ["ingest", "cassandra", *common, "--keyspace", where["keyspace"], "--verify"],
    ):
        if ingest(argv) != 0:
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
