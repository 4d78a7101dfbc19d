"""The quiet-machine record: a benchmark's own CPU (its process, children and servers) is told apart from the rest."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path

from imgest.bench.measure import QUIET_CORES, Quietness, QuietWatch

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"


def test_a_child_and_a_named_server_count_as_ours_a_stranger_does_not(tmp_path: Path) -> None:
    go, done = tmp_path / "go", tmp_path / "stranger-done"
    wait = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.02)\n"
    stranger = f"{wait}{BURN}open({str(done)!r}, 'w').close()\n"
    # a process outside the tree: sh starts it in the background and exits before the watch, so init adopts it
    subprocess.run(["sh", "-c", f"{shlex.quote(sys.executable)} -c {shlex.quote(stranger)} &"], check=True)
    server = subprocess.Popen([sys.executable, "-c", BURN])  # the benchmark's "server", named by PID
    with QuietWatch([server.pid]) as watch:
        subprocess.run([sys.executable, "-c", BURN], check=True)  # the benchmark's own child
        server.wait(timeout=60)
        go.touch()
        deadline = time.monotonic() + 60
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    r = watch.result
    assert done.exists()
    assert r.ours_cores * r.seconds >= 0.75  # the child's 0.4 CPU seconds and the server's 0.4
    assert r.other_cores * r.seconds >= 0.3  # the stranger's 0.4, not ours


def test_an_orphan_of_the_tree_stays_ours(tmp_path: Path) -> None:
    done = tmp_path / "orphan-done"
    orphan = f"{BURN}open({str(done)!r}, 'w').close()\n"
    with QuietWatch() as watch:  # sh exits while its background child runs on: init adopts it, it stays ours
        subprocess.run(["sh", "-c", f"{shlex.quote(sys.executable)} -c {shlex.quote(orphan)} & sleep 1"], check=True)
        deadline = time.monotonic() + 60
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert done.exists()
    assert watch.result.ours_cores * watch.result.seconds >= 0.3


def test_quiet_only_below_the_limit_and_the_record_says_so() -> None:
    q = Quietness(seconds=10, other_cores=QUIET_CORES + 0.05)
    assert not q.quiet
    assert q.to_dict()["quiet"] is False
    assert "NOT quiet" in q.describe()
    assert Quietness(seconds=10, other_cores=QUIET_CORES / 2).quiet
