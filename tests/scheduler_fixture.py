"""One `airflow standalone` (UI, scheduler, workers) for the tests that need a scheduler: the browser tests and the
refresh tests. Starting it costs half a minute of two cores, so it starts once, with a datasets file that
registers the refresh tests' datasets; collection runs those tests one after another (tests/conftest.py) and
the server stops after the last of them, with $IMGEST_DATASETS_FILE restored for the rest of the session."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from imgest.services import AirflowServer
from imgest.sources.devdata.sample import SampleSpec, write_sample

FIXTURE = "airflow_scheduler"
KEYSPACE = "imgest_refresh_test"
DEST = "s3://imgest/refresh-test/rfx"
# A real schedule whose first run is years away: the scheduler must not start a run of its own during the test.
SCHEDULE = "0 0 29 2 *"
REFRESH_DAGS = {"refresh_rfx", "refresh_rfa", "refresh_rfb"}
CHECK_DAG = "check_datasets"
CLEANUP_ENV = "AIRFLOW__SCHEDULER__PARSING_CLEANUP_INTERVAL"
# The DAG files do not change while the suite runs: the DAG processor parses each once instead of every 30 s (its
# parses were a quarter of the scheduler's CPU, 40 of 260 CPU s over nine minutes).
REPARSE_ENV = "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL"
_stoppers: list[Callable[[], None]] = []


_sources: dict[str, Path] = {}


def refresh_sources(root: Path | None = None) -> dict[str, Path]:
    """name -> source folder of the registered datasets (rfx: cassandra + shards; rfa, rfb: shards), written
    under ROOT on the first call (the scheduler fixture's temporary folder)."""
    if not _sources:
        assert root is not None, "the airflow_scheduler fixture writes the sources first"
        write_sample(root / "rfx", SampleSpec("imagefolder", classes=3, per_class=6, val_per_class=2, seed=5))
        for name in ("rfa", "rfb"):
            write_sample(root / name, SampleSpec("imagefolder", classes=2, per_class=5, val_per_class=1, seed=9))
        _sources.update({name: root / name for name in ("rfx", "rfa", "rfb")})
    return _sources


def write_datasets(path: Path, root: Path) -> Path:
    sources = refresh_sources(root)
    others = "".join(
        f'[datasets.{name}]\nsource = "{sources[name]}"\n'
        f'layout = "imagefolder"\ntargets = ["shards"]\nschedule = "{SCHEDULE}"\n'
        f's3_dest = "s3://imgest/refresh-test/{name}"\n\n'
        for name in ("rfa", "rfb")
    )
    path.write_text(
        others + f'[datasets.rfx]\nsource = "{sources["rfx"]}"\nlayout = "imagefolder"\n'
        f'targets = ["cassandra", "shards"]\nschedule = "{SCHEDULE}"\nkeyspace = "{KEYSPACE}"\n'
        f's3_dest = "{DEST}"\nshard_max_count = 4\n'
    )
    return path


def listed_dags(server: AirflowServer) -> set[str]:
    """DAG ids the DAG processor has stored in the metadata DB (none before the DB has its tables)."""
    try:
        with sqlite3.connect(server.home / "airflow.db") as db:
            return {r[0] for r in db.execute("SELECT dag_id FROM dag")}
    except sqlite3.OperationalError:
        return set()


def pause_refresh_dags(server: AirflowServer, timeout: float = 180) -> None:
    """The scheduler must not run the runs `airflow dags test` creates (both would execute their tasks): pause
    the refresh DAGs once the DAG processor has listed them. Both the wait and the pause go to the metadata DB
    (the column `airflow dags pause` sets): an `airflow` CLI call costs 5 s of CPU. `dags test` runs paused DAGs.
    check_datasets is paused too: the browser tests' runs announce Assets, and the check each would trigger reads
    the sample back with every reader while later tests run; the refresh tests, which test that trigger, resume
    it (resume_checks). A paused DAG is not queued by an Asset event, so no check is left waiting."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not listed_dags(server) >= REFRESH_DAGS | {CHECK_DAG}:
        time.sleep(1)
    _set_paused(server, REFRESH_DAGS | {CHECK_DAG}, True)


def resume_checks(server: AirflowServer) -> None:
    """Let the Asset events of the runs from now on trigger check_datasets (paused by pause_refresh_dags)."""
    _set_paused(server, {CHECK_DAG}, False)


def pause_checks(server: AirflowServer) -> None:
    """Stop the Asset events of the runs from now on triggering check_datasets."""
    _set_paused(server, {CHECK_DAG}, True)


def _set_paused(server: AirflowServer, dags: set[str], paused: bool) -> None:
    marks = ",".join("?" * len(dags))
    with sqlite3.connect(server.home / "airflow.db", timeout=60) as db:
        db.execute(f"UPDATE dag SET is_paused = ? WHERE dag_id IN ({marks})", [int(paused), *sorted(dags)])
    with sqlite3.connect(server.home / "airflow.db") as db:
        now = {r[0] for r in db.execute("SELECT dag_id FROM dag WHERE is_paused")}
    assert (now >= dags) if paused else not (now & dags), now


def scheduler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowServer]:
    """The fixture's body (tests/conftest.py declares it, with the services it needs)."""
    datasets = write_datasets(tmp_path_factory.mktemp("datasets") / "datasets.toml", tmp_path_factory.mktemp("refresh"))
    old = os.environ.get("IMGEST_DATASETS_FILE")
    os.environ["IMGEST_DATASETS_FILE"] = str(datasets)
    # An Asset emitted through an AssetAlias is listed (active) at the next parsing cleanup: every 2 s, not 10 s
    os.environ[CLEANUP_ENV] = "2"
    os.environ[REPARSE_ENV] = "3600"
    server = AirflowServer.default()
    if server.answers():  # a standalone started without our datasets file: restart it with it
        server.down()
    print(f"\n[fixture] {server.up().message}")
    pause_refresh_dags(server)
    stopped = False

    def stop() -> None:
        nonlocal stopped
        if not stopped:
            stopped = True
            server.down()
            os.environ.pop(CLEANUP_ENV, None)
            os.environ.pop(REPARSE_ENV, None)
            if old is None:
                os.environ.pop("IMGEST_DATASETS_FILE", None)
            else:
                os.environ["IMGEST_DATASETS_FILE"] = old

    _stoppers.append(stop)
    yield server
    stop()


def uses_scheduler(item: pytest.Item | None) -> bool:
    return item is not None and FIXTURE in getattr(item, "fixturenames", ())


def stop_after_last_user(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the scheduler once the last test that uses it has run (collection keeps them together)."""
    if uses_scheduler(item) and not uses_scheduler(nextitem):
        while _stoppers:
            _stoppers.pop()()
