"""Service lifecycle without services: scratch of killed tasks is cleaned, weed logs go to the state folder,
status and down cover every service, local masters retry tasks, state folders are private."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from imgest.core import scratch
from imgest.core.errors import ServiceError
from imgest.core.paths import private
from imgest.services import ALL_SERVICE_NAMES
from imgest.services.s3 import S3Server, require_disk_room
from imgest.spark.submit import submit_command, with_task_retries


def test_scratch_of_dead_processes_is_removed_live_ones_kept(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = tmp_path / f"{scratch.PREFIX}{dead.stdout.strip()}-abc"
    mine = tmp_path / f"{scratch.PREFIX}{os.getpid()}-xyz"
    other = tmp_path / f"{scratch.PREFIX}oldstyle"
    for folder in (gone, mine, other):
        folder.mkdir()
        (folder / "part.tar").write_bytes(b"x" * 10)
    assert scratch.clean_stale(tmp_path) == [gone]
    assert not gone.exists()
    assert mine.exists()
    assert other.exists()


def test_weed_writes_its_logs_under_the_state_folder(tmp_path: Path) -> None:
    server = S3Server(home=tmp_path / "s3")
    cmd = server.command("weed", tmp_path / "ids.json")
    assert cmd[1] == f"-logdir={tmp_path / 's3' / 'logs'}"
    assert cmd[2] == "mini"


def test_weed_volume_slots_do_not_depend_on_free_space_at_start(tmp_path: Path) -> None:
    cmd = S3Server(home=tmp_path / "s3").command("weed", tmp_path / "ids.json")
    assert "-volume.max=64" in cmd


def test_s3_refuses_to_start_on_a_disk_too_full_for_writes(tmp_path: Path) -> None:
    """A real 64 MiB tmpfs is below SeaweedFS's read-only floor plus the margin: the error says where and how much."""
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(small)], check=True)
    try:
        with pytest.raises(ServiceError, match=r"GiB is free on the disk holding .*small.*read-only below 1 % free"):
            require_disk_room(small)
    finally:
        subprocess.run(["umount", str(small)], check=True)
    require_disk_room(tmp_path)  # the test machine's own disk has room (or every S3 test would fail anyway)


def test_status_lists_every_service_the_project_can_start(tmp_path: Path) -> None:
    imgest = Path(sys.executable).parent / "imgest"
    env = {**os.environ, "IMGEST_HOME": str(tmp_path / "home")}
    done = subprocess.run([imgest, "services", "status"], capture_output=True, text=True, env=env, check=False)
    listed = {line.split()[0] for line in done.stdout.splitlines() if line.strip()}
    assert set(ALL_SERVICE_NAMES) <= listed, done.stdout
    assert {"cassandra-auth", "latency-proxy"} <= set(ALL_SERVICE_NAMES)


def test_local_masters_get_task_retries() -> None:
    assert with_task_retries("local[*]") == "local[*,4]"
    assert with_task_retries("local[2]") == "local[2,4]"
    assert with_task_retries("local") == "local[1,4]"
    assert with_task_retries("local[2,1]") == "local[2,1]"
    assert with_task_retries("spark://m:7077") == "spark://m:7077"
    cmd = submit_command("pack_shards", ["--x"], "local[2]")
    assert cmd[cmd.index("--master") + 1] == "local[2,4]"


def test_private_makes_folders_0700_and_files_0600(tmp_path: Path) -> None:
    folder, secret = tmp_path / "state", tmp_path / "state" / "airflow.db"
    folder.mkdir(mode=0o755)
    secret.write_text("x")
    secret.chmod(0o644)
    private(folder)
    private(secret)
    assert folder.stat().st_mode & 0o777 == 0o700
    assert secret.stat().st_mode & 0o777 == 0o600


def test_services_write_logs_and_files_private(tmp_path: Path) -> None:
    """What a managed service writes (its log, its generated files) is 0600, whatever the caller's umask."""
    import time

    from imgest.services.process import ManagedProcess

    proc = ManagedProcess("t", tmp_path / "t.pid", tmp_path / "logs" / "t.log")
    pid = proc.start(["sh", "-c", "echo generated-password > passwords.json; echo started"], cwd=tmp_path)
    for _ in range(100):
        if (tmp_path / "passwords.json").exists() and proc.pid() is None:
            break
        time.sleep(0.05)
    assert pid > 0
    assert (tmp_path / "passwords.json").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "logs" / "t.log").stat().st_mode & 0o777 == 0o600
