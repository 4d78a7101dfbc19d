"""Real Spark jobs on hostile inputs: nothing ingestible fails every target with one sentence naming the
quarantine list and stores nothing; a killed Python worker is retried instead of failing the job."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from imgest.services import CassandraServer
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.manifest import iter_manifest
from imgest.sources.scan import scan_to_dir
from imgest.spark.pypath import DAEMON_MODULE
from imgest.spark.submit import submit_command, submit_env
from tests.jobs.conftest import MASTER

pytestmark = [pytest.mark.services, pytest.mark.slow]
IMGEST = str(Path(sys.executable).parent / "imgest")
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+ INFO imgest\.")


@pytest.fixture(scope="module")
def all_bad(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two classes of files named .JPEG that are text, empty or garbage: every one is quarantined."""
    src = tmp_path_factory.mktemp("allbad") / "src"
    for wnid in ("n01", "n02"):
        (src / wnid).mkdir(parents=True)
        (src / wnid / "text.JPEG").write_text("not an image")
        (src / wnid / "empty.JPEG").write_bytes(b"")
        (src / wnid / "garbled.JPEG").write_bytes(b"\xff\xd8\xff\xe0" + os.urandom(200))
    return src


def _ingest(argv: list[str]) -> subprocess.CompletedProcess[str]:
    cmd = [IMGEST, "ingest", *argv, "--master", MASTER]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)


def _assert_nothing_ingestible(done: subprocess.CompletedProcess[str], work: Path, target: str) -> None:
    lines = [line for line in done.stderr.splitlines() if not LOG_LINE.match(line)]  # imgest's own INFO lines
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert lines[0].startswith("imgest: error: ")
    assert "nothing was ingestible: all 6 candidates were quarantined" in lines[0]
    assert str(work / f"quarantine-{target}.json") in lines[0]
    assert f"full log: {work / f'spark-{target}.log'}" in lines[1]
    assert "Traceback" not in done.stdout + done.stderr
    listed = json.loads((work / f"quarantine-{target}.json").read_text())
    assert listed["quarantined"] == 6
    assert listed["stored"] == 0


def test_nothing_ingestible_fails_files_and_shards_and_publishes_nothing(all_bad: Path, tmp_path: Path) -> None:
    for target in ("files", "shards"):
        work, dest = tmp_path / f"w-{target}", tmp_path / f"dest-{target}"
        done = _ingest([target, str(all_bad), "--dest", str(dest), "--work-dir", str(work)])
        _assert_nothing_ingestible(done, work, target)
        assert not (dest / "manifest.json").exists()
        assert not [p for p in dest.glob("*.tar")] if dest.exists() else True


def test_nothing_ingestible_fails_cassandra_and_never_writes_a_version(
    all_bad: Path, cassandra_server: CassandraServer, tmp_path: Path
) -> None:
    from imgest.core.settings import CassandraSettings
    from imgest.sinks.cassandra.client import cassandra_session

    with cassandra_session(
        CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)
    ) as session:
        session.execute("DROP KEYSPACE IF EXISTS hostile_none", timeout=60)  # a record left by an earlier run
    work = tmp_path / "w"
    argv = ["cassandra", str(all_bad), "--keyspace", "hostile_none", "--work-dir", str(work)]
    done = _ingest([*argv, "--port", str(cassandra_server.native_port)])
    _assert_nothing_ingestible(done, work, "cassandra")
    with cassandra_session(
        CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)
    ) as session:
        rows = session.execute("SELECT status FROM hostile_none.dataset_versions").all()
    assert [r.status for r in rows] == ["writing"]  # never 'written' or 'complete'


def _python_workers(root: int) -> list[psutil.Process]:
    """The forked Python workers under spark-submit ROOT (children of the worker daemon: imgest's on a local
    master, imgest.spark.pypath)."""
    found = []
    for proc in psutil.Process(root).children(recursive=True):
        try:
            parent = proc.parent()
            if parent is not None and DAEMON_MODULE in parent.cmdline():  # `python -m DAEMON_MODULE`, not spark-submit
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_a_killed_python_worker_is_retried_not_fatal(tmp_path: Path) -> None:
    write_sample(tmp_path / "src", SampleSpec("imagefolder", classes=4, per_class=40, val_per_class=2, seed=3))
    scan_to_dir(tmp_path / "src", tmp_path / "m")
    rows = sum(1 for _ in iter_manifest(tmp_path / "m" / "manifest.parquet"))
    summary = tmp_path / "summary.json"
    args = ["--manifest-dir", str(tmp_path / "m"), "--dest", str(tmp_path / "files"), "--partitions", "16"]
    cmd = submit_command("write_files", [*args, "--summary-json", str(summary)], MASTER)
    assert cmd[cmd.index("--master") + 1] == "local[2,4]"
    with open(tmp_path / "job.log", "w") as log:
        proc = subprocess.Popen(cmd, env=submit_env(MASTER), stdout=log, stderr=subprocess.STDOUT)
        killed = None
        deadline = time.monotonic() + 300
        while killed is None and proc.poll() is None and time.monotonic() < deadline:
            workers = _python_workers(proc.pid)
            if workers:
                killed = workers[0].pid
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.05)
        rc = proc.wait(timeout=600)
    assert killed is not None, "no Python worker was seen"
    assert rc == 0, (tmp_path / "job.log").read_text()[-3000:]
    written = json.loads(summary.read_text())
    assert sum(written["samples"].values()) == rows
    assert len(list((tmp_path / "files").rglob("*.jpg"))) == rows
