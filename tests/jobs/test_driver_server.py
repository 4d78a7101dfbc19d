"""The suite's reused Spark driver (imgest.spark.driver_server): jobs run in it, with the caller's environment
and log file; a busy server, another master, other Spark settings or another identity of the executors' own go
through spark-submit; a failed job leaves it serving."""

from __future__ import annotations

import fcntl
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from imgest.cli import main as cli
from imgest.sinks.files.layout import data_root
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.spark import driver_server
from imgest.spark.submit import submit_command


def _jobs_run(server_log: Path) -> list[tuple[str, int]]:
    return [(m[1], int(m[2])) for m in re.finditer(r"job \d+ \((\w+)\) exited (-?\d+)", server_log.read_text())]


def _shas(dest: Path) -> list[str]:
    return pq.read_table(data_root(dest) / "samples.parquet", columns=["sha256"]).column("sha256").to_pylist()


@pytest.mark.slow  # runs Spark jobs: the full tier's (the quick tier runs no Spark job)
def test_jobs_run_in_the_reused_driver_and_go_to_spark_submit_when_it_is_busy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sock = tmp_path / "d.sock"
    monkeypatch.setenv(driver_server.SOCKET_ENV, str(sock))
    src = tmp_path / "src"
    write_sample(src, SampleSpec("imagefolder", classes=2, per_class=4, val_per_class=1, seed=3, large_every=0))

    def ingest(name: str, *extra: str) -> int:
        base = [str(src), "--work-dir", str(tmp_path / f"w-{name}"), "--dataset", "ds", "--master", "local[2]"]
        return cli(["ingest", "files", *base, "--dest", str(tmp_path / name), *extra])

    try:
        assert ingest("a") == 0
        assert ingest("b") == 0
        assert _jobs_run(sock.with_suffix(".log")) == [("write_files", 0), ("write_files", 0)]
        assert _shas(tmp_path / "a") == _shas(tmp_path / "b")
        assert '"images_per_s"' in (tmp_path / "w-b" / "spark-files.log").read_text()  # the job's summary, in its log

        (tmp_path / "c").write_text("a file where the job wants a folder")
        assert ingest("c") == 2  # the job's own error, its exit code as from spark-submit
        assert _jobs_run(sock.with_suffix(".log"))[-1] == ("write_files", 2)
        assert "FileExistsError" in (tmp_path / "w-c" / "spark-files.log").read_text()

        with open(sock.with_suffix(".lock"), "a") as held:  # another job has the server
            fcntl.flock(held, fcntl.LOCK_EX)
            assert ingest("d") == 0
        assert len(_jobs_run(sock.with_suffix(".log"))) == 3  # "d" went through spark-submit
        assert _shas(tmp_path / "d") == _shas(tmp_path / "a")
        with monkeypatch.context() as pod:  # another identity than its executors took from the first job
            pod.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/another-pod")
            assert ingest("e") == 0
        assert len(_jobs_run(sock.with_suffix(".log"))) == 3  # "e" went through spark-submit
    finally:
        assert driver_server.stop(sock)
    assert not sock.exists()


@pytest.mark.parametrize(
    ("master", "conf"),
    [("spark://127.0.0.1:7077", None), ("local[2]", {"spark.executor.memory": "2g"})],
)
def test_cluster_masters_and_other_settings_are_not_for_the_reused_driver(
    tmp_path: Path, master: str, conf: dict[str, str] | None
) -> None:
    cmd = submit_command("write_files", ["--manifest-dir", "x"], master, conf)
    assert driver_server._request(cmd, tmp_path / "log", None) is None
    local = submit_command("write_files", ["--manifest-dir", "x"], "local[2]")
    request = driver_server._request(local, tmp_path / "log", {"EXTRA": "1"})
    assert request is not None
    assert request["master"] == "local[2,4]"
    assert request["args"] == ["--manifest-dir", "x"]
    assert request["env"]["EXTRA"] == "1"
