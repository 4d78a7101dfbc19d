"""Scheduled incremental refresh against the real services: `airflow dags test refresh_<name>` applies exactly
the source's changes (Cassandra rows and bytes, shard manifest and read-back), a refresh without change runs no
Spark job, and the Asset it publishes triggers `check_datasets` in a running `airflow standalone`."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from imgest.core.locks import dataset_lock
from imgest.core.paths import state_dir
from imgest.core.settings import CassandraSettings
from imgest.flow.checks import check_out_dir
from imgest.flow.registry import load_registry
from imgest.services import AirflowServer, CassandraServer, S3Server, airflow_cli
from imgest.services.airflow_cli import WarmCommand
from imgest.services.demo import task_durations, task_results
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sinks.shards.shard_table import dead_keys
from imgest.sinks.shards.store import open_store
from imgest.sinks.shards.store_names import samples_object
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.manifest import image_id
from tests.scheduler_fixture import DEST, KEYSPACE, listed_dags, pause_checks, refresh_sources, resume_checks

pytestmark = [pytest.mark.services, pytest.mark.slow]


@pytest.fixture(scope="module")
def source(airflow_scheduler: AirflowServer) -> Path:
    """The rfx dataset's source folder (registered in the shared scheduler's datasets file)."""
    return refresh_sources()["rfx"]


@pytest.fixture(scope="module")
def scheduler(airflow_scheduler: AirflowServer) -> AirflowServer:
    """The shared scheduler (check_datasets paused: the test that checks that the Assets trigger it resumes it)."""
    return airflow_scheduler


def _refresh(airflow: AirflowServer, name: str = "rfx", output: list[str] | None = None) -> dict[str, str | None]:
    """Run refresh_NAME with `airflow dags test` (its task logs go to its output, appended to OUTPUT when given);
    returns task -> state."""
    proc = airflow.airflow("dags", "test", f"refresh_{name}", check=False)
    assert proc.returncode == 0, (proc.stdout or "")[-3000:] + (proc.stderr or "")[-3000:]
    if output is not None:
        output.append((proc.stdout or "") + (proc.stderr or ""))
    return {task: state for task, state, _ in task_durations(airflow, f"refresh_{name}")}


def _check_runs(airflow: AirflowServer) -> list[dict]:
    """check_datasets' runs (state, start_date) from the metadata DB."""
    with sqlite3.connect(airflow.home / "airflow.db") as db:
        rows = db.execute("SELECT run_id, state, start_date FROM dag_run WHERE dag_id = 'check_datasets'").fetchall()
    return [{"run_id": r, "state": st, "start_date": sd} for r, st, sd in rows]


def _wait_checks(airflow: AirflowServer, version: str, timeout: float = 420) -> list[dict]:
    """Wait until check_datasets has written both targets' reports for VERSION and no check run is active."""
    reports = [check_out_dir("rfx", t, version) / "read_throughput.json" for t in ("cassandra", "shards")]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = _check_runs(airflow)
        if all(p.is_file() for p in reports) and all(r["state"] in ("success", "failed") for r in runs):
            return runs
        time.sleep(1)
    raise AssertionError(f"check_datasets did not check {version}: runs {_check_runs(airflow)}")


def _change_source(source: Path, tmp: Path) -> dict[str, list[str]]:
    """Add 10 images, change 3, delete 2, touch 1 (same bytes, new mtime; train split); returns their ids."""
    more = tmp / "more"
    write_sample(more, SampleSpec("imagefolder", classes=3, per_class=10, val_per_class=2, seed=5))
    other = tmp / "other"
    write_sample(other, SampleSpec("imagefolder", classes=3, per_class=6, val_per_class=2, seed=77))
    wnids = sorted(p.name for p in (source / "train").iterdir())
    added = [f"train/{w}/{w}_{n}.JPEG" for w in wnids for n in (7, 8, 9, 10)][:10]
    changed = [
        f"train/{wnids[0]}/{wnids[0]}_1.JPEG",
        f"train/{wnids[1]}/{wnids[1]}_2.JPEG",
        f"train/{wnids[2]}/{wnids[2]}_3.JPEG",
    ]
    removed = [f"train/{wnids[0]}/{wnids[0]}_6.JPEG", f"train/{wnids[2]}/{wnids[2]}_5.JPEG"]
    for rel in added:
        shutil.copyfile(more / rel, source / rel)
    for rel in changed:
        assert (other / rel).read_bytes() != (source / rel).read_bytes()
        shutil.copyfile(other / rel, source / rel)
    for rel in removed:
        (source / rel).unlink()
    touched = [f"train/{wnids[1]}/{wnids[1]}_4.JPEG"]
    later = time.time() + 60
    os.utime(source / touched[0], (later, later))
    ids = {
        k: [image_id("rfx", "train", r) for r in v]
        for k, v in {"added": added, "changed": changed, "removed": removed, "touched": touched}.items()
    }
    return ids


def _rows(cassandra: CassandraServer) -> dict[str, tuple[str, str, str]]:
    """id -> (version, src_sha256, sha256 of the stored bytes) of every row of the refresh test's tables."""
    with cassandra_session(CassandraSettings(hosts=(cassandra.host,), port=cassandra.native_port)) as session:
        meta = {
            str(r.id): (r.version, r.src_sha256)
            for r in session.execute(f"SELECT id, version, src_sha256 FROM {KEYSPACE}.metadata")
        }
        data = {
            str(r.id): hashlib.sha256(bytes(r.data)).hexdigest()
            for r in session.execute(f"SELECT id, data FROM {KEYSPACE}.data")
        }
    assert set(meta) == set(data)
    return {i: (*meta[i], data[i]) for i in meta}


def _versions(cassandra: CassandraServer) -> dict[str, tuple[str, dict | None]]:
    with cassandra_session(CassandraSettings(hosts=(cassandra.host,), port=cassandra.native_port)) as session:
        rows = session.execute(
            f"SELECT version, status, changes FROM {KEYSPACE}.dataset_versions WHERE dataset = 'rfx'"
        )
        return {r.version: (r.status, dict(r.changes) if r.changes else None) for r in rows}


def _lineage(cassandra: CassandraServer, version: str) -> list[str]:
    with cassandra_session(CassandraSettings(hosts=(cassandra.host,), port=cassandra.native_port)) as session:
        row = session.execute(
            f"SELECT lineage FROM {KEYSPACE}.dataset_versions WHERE dataset = 'rfx' AND version = %s", (version,)
        ).one()
        return list(row.lineage or [])


def _shards(s3: S3Server) -> tuple[dict, dict[str, str]]:
    """The live manifest.json and id -> sha256 of the image member of every live sample of its shards (a kept
    shard's dead samples, listed in its entry, are skipped)."""
    store = open_store(DEST, s3.settings())
    manifest = store.read_manifest()
    assert manifest is not None
    images: dict[str, str] = {}
    dead_of = dead_keys(store, manifest)  # from the version's shards.parquet
    for shard in manifest["shards"]:
        chunks = store.read_chunks(shard["path"])
        assert chunks is not None
        body = b"".join(chunks)
        assert hashlib.sha256(body).hexdigest() == shard["sha256"]
        dead = dead_of.get(shard["name"], frozenset())
        with tarfile.open(fileobj=io.BytesIO(body)) as tar:
            for member in tar.getmembers():
                if member.name.endswith(".jpg") and member.name.removesuffix(".jpg") not in dead:
                    key = member.name.removesuffix(".jpg")
                    assert key not in images
                    images[key] = hashlib.sha256(tar.extractfile(member).read()).hexdigest()  # type: ignore[union-attr]
    return manifest, images


def test_refresh_applies_exactly_the_changes(
    scheduler: AirflowServer,
    cassandra_server: CassandraServer,
    s3_server: S3Server,
    source: Path,
    tmp_path: Path,
) -> None:
    resume_checks(scheduler)  # this test checks that the Assets trigger check_datasets
    with cassandra_session(
        CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)
    ) as session:
        session.execute(f"DROP KEYSPACE IF EXISTS {KEYSPACE}", timeout=60)
    shutil.rmtree(state_dir() / "work" / "rfx", ignore_errors=True)
    assert "refresh_rfx" in listed_dags(scheduler)
    # First run: everything is new (version r1).
    states = _refresh(scheduler)
    assert states["cassandra.ingest"] == states["shards.ingest"] == "success", states
    first = _rows(cassandra_server)
    assert len(first) == 24  # 18 train + 6 val
    manifest1, images1 = _shards(s3_server)
    assert len(images1) == 24
    v1 = task_results(scheduler, "refresh_rfx", ("cassandra.plan",))["cassandra.plan"]["version"]
    before = len(_wait_checks(scheduler, v1))  # the Assets of r1 triggered check_datasets

    ids = _change_source(source, tmp_path)
    output: list[str] = []
    states = _refresh(scheduler, output=output)
    assert states["cassandra.ingest"] == states["shards.ingest"] == "success", states
    plans = task_results(scheduler, "refresh_rfx", ("cassandra.plan", "shards.plan"))
    # The touched file: Cassandra's metadata holds the source sha256 its ingest recorded (the first version's plan
    # read no file), so the plan tells it unchanged; the shards target records none, so it is re-packed in place.
    expected = {"added": 10, "changed": 3, "removed": 2, "unchanged": 19}
    assert plans["cassandra.plan"]["counts"] == expected
    repacked = {**expected, "changed": 4, "unchanged": 18}
    assert plans["shards.plan"]["counts"] == repacked
    version = plans["cassandra.plan"]["version"]
    assert version.endswith("-r2")
    assert "as written" in output[0]  # the job took the re-plan's file, not a rewrite of it
    # Cassandra: 24 + 10 - 2 rows; removed gone; changed rows hold the new source's bytes. Only the added and
    # changed rows were written (version r2); the unchanged ones were not touched (still r1), and belong to r2
    # through its lineage: finish costs in proportion to the change.
    rows = _rows(cassandra_server)
    assert len(rows) == 32
    assert not set(ids["removed"]) & set(rows)
    assert set(ids["added"]) <= set(rows)
    written = set(ids["added"]) | set(ids["changed"])
    assert {i for i, (v, _, _) in rows.items() if v == version} == written
    assert {v for i, (v, _, _) in rows.items() if i not in written} == {v1}
    assert _lineage(cassandra_server, version) == [v1, version]
    for i in ids["changed"]:
        assert rows[i][1] != first[i][1]
        assert rows[i][2] != first[i][2]
    unchanged = set(first) - set(ids["changed"]) - set(ids["removed"])
    assert all(rows[i][1:] == first[i][1:] for i in unchanged)
    versions = _versions(cassandra_server)
    assert versions[version] == ("complete", expected)
    assert versions[version.replace("-r2", "-r1")][0] == "replaced"
    # Shards: new manifest with the version's counts; untouched shards kept as they were; every sample read back.
    manifest2, images2 = _shards(s3_server)
    assert manifest2["version"]["name"] == version
    assert manifest2["version"]["changes"] == repacked
    assert set(images2) == set(rows)
    assert all(images2[i] == images1[i] for i in unchanged)  # the re-packed touched image too: same bytes
    old = {s["name"]: s["sha256"] for s in manifest1["shards"]}
    kept = [s for s in manifest2["shards"] if s["name"] in old]
    assert kept
    assert all(old[s["name"]] == s["sha256"] for s in kept)
    paths = {s["name"]: s["path"] for s in manifest1["shards"]}
    assert all(s["path"] == paths[s["name"]] for s in kept)  # kept shards are named where they are, not copied
    assert {s["path"].split("/")[1] for s in manifest2["shards"] if s["name"] not in old} == {manifest2["key"]}
    # verified by the Spark job (shards.verify) on the executors: the new shards hashed, the kept ones by size; the
    # finish task took its report rather than reading the shards again in the worker
    checked = task_results(scheduler, "refresh_rfx", ("shards.verify", "shards.finish"))
    report = checked["shards.verify"]
    assert (report["ok"], report["shards"], report["kept_unhashed"]) == (True, len(manifest2["shards"]), len(kept))
    assert report["hashed_bytes"] == sum(s["bytes"] for s in manifest2["shards"] if s["name"] not in old)
    assert checked["shards.finish"]["verification"] == report
    # gc after publish (keep_versions 1): r2 and r1 kept, so r1's dropped shards are still there
    gc = task_results(scheduler, "refresh_rfx", ("shards.gc",))["shards.gc"]
    assert states["shards.gc"] == "success"
    assert gc["kept"] == [manifest2["key"], manifest1["key"]]
    table_name = samples_object(manifest2)
    samples = pq.read_table(io.BytesIO(b"".join(open_store(DEST, s3_server.settings()).read_chunks(table_name))))
    assert sorted(samples.column("id").to_pylist()) == sorted(rows)
    # The Asset events of r2 triggered check_datasets, which read the new version back (every byte checked).
    runs = _wait_checks(scheduler, version)
    assert len(runs) > before
    newest = max(runs, key=lambda r: r.get("start_date") or "")
    assert newest["state"] == "success", runs  # the run r2's Asset events triggered
    checks = json.loads((check_out_dir("rfx", "cassandra", version) / "read_throughput.json").read_text())
    assert checks["version"] == version
    assert all(r["ok"] for r in checks["readers"])

    # No change: no Spark job, no new version.
    states = _refresh(scheduler)
    assert states["cassandra.ingest"] == states["shards.ingest"] == "skipped", states
    assert states["release_lock"] == "success"
    plans = task_results(scheduler, "refresh_rfx", ("cassandra.plan", "shards.plan"))
    assert not plans["cassandra.plan"]["changed"]
    assert not plans["shards.plan"]["changed"]
    assert set(_versions(cassandra_server)) == set(versions)
    manifest3 = _shards(s3_server)[0]
    assert manifest3.pop("checks")["read_throughput"].endswith(f"/checks/shards/{version}/read_throughput.json")
    assert manifest3 == manifest2  # the check recorded its report with r2; nothing else changed


def test_datasets_in_parallel_one_writer_per_dataset(scheduler: AirflowServer, s3_server: S3Server) -> None:
    pause_checks(scheduler)  # the checks their Assets would trigger are the test above's, not this one's
    for name in ("rfa", "rfb"):
        shutil.rmtree(state_dir() / "work" / name, ignore_errors=True)
    # Two datasets at once: both runs overlap in time and both are right.
    procs = {n: _dags_test(scheduler, f"refresh_{n}") for n in ("rfa", "rfb")}
    outputs = {n: p.communicate(timeout=900)[0] for n, p in procs.items()}
    assert all(p.returncode == 0 for p in procs.values()), {n: o[-2000:] for n, o in outputs.items()}
    spans = {n: _run_span(scheduler, f"refresh_{n}") for n in procs}
    assert max(start for start, _ in spans.values()) < min(end for _, end in spans.values()), spans  # overlap
    for name in procs:
        manifest = open_store(f"s3://imgest/refresh-test/{name}", s3_server.settings()).read_manifest()
        assert manifest is not None
        assert manifest["samples"] == {"train": 10, "val": 2}
        assert manifest["version"]["changes"]["added"] == 12
    # One dataset twice: while this process holds rfa, a DAG run of rfa waits and a CLI ingest of rfa is refused.
    # rfa is written to s3://imgest/...: every writer of it keeps its lock beside that destination.
    from imgest.core.lock_stores import lock_url_for, store_at

    beside = store_at(str(lock_url_for("s3://imgest/refresh-test/rfa")), s3_server.settings())
    with dataset_lock("rfa", "the test's own writer", store=beside):
        waiting = _dags_test(scheduler, "refresh_rfa")
        src = load_registry().entry("rfa").settings["source"]
        cli = subprocess.run(
            [
                str(Path(sys.executable).parent / "imgest"),
                "ingest",
                "shards",
                src,
                "--dataset",
                "rfa",
                "--dest",
                "s3://imgest/refresh-test/rfa-cli",
            ],
            env=scheduler.env(),
            capture_output=True,
            text=True,
            check=False,
        )
        assert cli.returncode == 1, cli.stdout + cli.stderr
        assert f"dataset 'rfa' is being written by pid {os.getpid()}" in cli.stderr
        holder = f"is being written by pid {os.getpid()}"
        lines: list[str] = []
        seen = threading.Event()

        def follow() -> None:  # `airflow dags test` prints its tasks' logs as they run
            for line in waiting.stdout or ():
                lines.append(line)
                if holder in line:
                    seen.set()

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        # the lock task logs who holds the dataset and defers: `dags test` runs its trigger in line (the task
        # queued meanwhile), a deployment's triggerer (tests/dags/test_celery_deployment.py) with the task deferred
        _wait_running(scheduler, "refresh_rfa", "lock", waiting, states=("running", "deferred", "queued"))
        assert seen.wait(120) or holder in _task_log(scheduler, "refresh_rfa", "lock"), "".join(lines)[-3000:]
        assert waiting.poll() is None  # still waiting for the lock
    waiting.wait(timeout=600)
    reader.join(timeout=60)
    out = "".join(lines)
    assert waiting.returncode == 0, out[-3000:]
    assert holder in out + _task_log(scheduler, "refresh_rfa", "lock"), out[-3000:]
    assert open_store("s3://imgest/refresh-test/rfa-cli", s3_server.settings()).read_manifest() is None


def _dags_test(airflow: AirflowServer, dag_id: str) -> subprocess.Popen | WarmCommand:
    """Start `airflow dags test DAG_ID` (in the warm CLI when the suite has one), its output on one pipe."""
    env = airflow.env()
    warm = airflow_cli.popen(["dags", "test", dag_id], env)
    if warm is not None:
        return warm
    cmd = [str(Path(sys.executable).parent / "airflow"), "dags", "test", dag_id]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_running(
    airflow: AirflowServer,
    dag_id: str,
    task_id: str,
    proc: subprocess.Popen | WarmCommand,
    timeout: float = 300,
    states: tuple[str, ...] = ("running",),
) -> None:
    """Wait until TASK_ID of the newest run of DAG_ID is in one of STATES (PROC is that `airflow dags test`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with sqlite3.connect(airflow.home / "airflow.db") as db:
            row = db.execute(
                "SELECT state FROM task_instance WHERE dag_id = ? AND task_id = ? AND run_id = "
                "(SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1)",
                (dag_id, task_id, dag_id),
            ).fetchone()
        if row and row[0] in states:
            return
        time.sleep(1)
    raise AssertionError(f"{dag_id}.{task_id} never ran while the lock was held (exit {proc.poll()})")


def _run_span(airflow: AirflowServer, dag_id: str) -> tuple[str, str]:
    with sqlite3.connect(airflow.home / "airflow.db") as db:
        row = db.execute(
            "SELECT min(start_date), max(end_date) FROM task_instance WHERE dag_id = ? AND task_id IN ('scan', "
            "'shards.finish') AND run_id = (SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1)",
            (dag_id, dag_id),
        ).fetchone()
    return row[0], row[1]


def _task_log(airflow: AirflowServer, dag_id: str, task_id: str) -> str:
    """The text of TASK_ID's logs in the latest run of DAG_ID."""
    with sqlite3.connect(airflow.home / "airflow.db") as db:
        run_id = db.execute(
            "SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1", (dag_id,)
        ).fetchone()[0]
    folder = airflow.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
    return "".join(p.read_text() for p in sorted(folder.rglob("*.log")))
