"""A job through Spark Connect that lets go of its client (imgest.spark.detach, what a deferrable task runs): at its
Spark call the client leaves the operation running on the server and exits; the trigger's follower stays attached
until it ends; the client run again takes the partitions' results from the run's results folder and goes on. The
shards it publishes are byte for byte those of the same job run attached, and nothing of the run is left behind."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import threading
from pathlib import Path

import pytest

from imgest.operators.connect_trigger import DONE, GONE, follow_operation
from imgest.services import S3Server
from imgest.services.spark_connect import SparkConnectServer
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.scan import scan_to_dir
from imgest.spark import detach
from imgest.spark.submit import connect_command

pytestmark = [pytest.mark.services, pytest.mark.slow]


def _client(args: list[str], master: str, env: dict[str, str]) -> tuple[int, str]:
    proc = subprocess.run(
        connect_command("pack_shards", args, master), env={**os.environ, **env}, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


def _shards(s3: S3Server, prefix: str) -> list[tuple[str, str]]:
    client = s3.settings().client()
    doc = json.loads(client.get_object(Bucket="imgest", Key=f"{prefix}/manifest.json")["Body"].read())
    body = lambda key: client.get_object(Bucket="imgest", Key=f"{prefix}/{key}")["Body"].read()  # noqa: E731
    return sorted((s["name"], hashlib.sha256(body(s["path"])).hexdigest()) for s in doc["shards"])


@pytest.mark.parametrize("state", ["local", "s3"])
def test_a_job_lets_go_of_its_client_while_spark_runs_and_resumes_from_its_kept_results(
    spark_connect: SparkConnectServer, s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str
) -> None:
    """local: the executors write the results where this client reads them (one machine); s3: in the state store
    (executors that share no disk with the worker), with the job's staged plan in the run's folder too."""
    write_sample(tmp_path / "src", SampleSpec("cls-loc", classes=3, per_class=8, val_per_class=2, seed=67))
    scan_to_dir(tmp_path / "src", tmp_path / "manifest", dataset="detach")
    run = secrets.token_hex(4)
    key, secret = s3_server.credentials()
    env = {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret, "IMGEST_S3_ENDPOINT": s3_server.endpoint}
    env["IMGEST_STATE_URL"] = "local" if state == "local" else f"s3://imgest/tests/state-{run}"
    for name, value in env.items():  # this process reads the run's folder as the client does
        monkeypatch.setenv(name, value)
    args = ["--manifest-dir", str(tmp_path / "manifest"), "--partitions", "3", "--max-count", "4"]

    rc, out = _client([*args, "--dest", f"s3://imgest/tests/attached-{run}"], spark_connect.url, env)
    assert rc == 0, out[-3000:]

    env |= {detach.RUN_ENV: run, detach.DETACH_ENV: str(tmp_path / "detached.json")}
    dest, events, detached = f"s3://imgest/tests/detached-{run}", [], []
    while True:
        rc, out = _client([*args, "--dest", dest], spark_connect.url, env)
        if rc != detach.DETACHED_EXIT:
            break
        record = json.loads((tmp_path / "detached.json").read_text())
        detached.append(record)
        assert record["state"] in ("RUNNING", "TERMINATING", "SUCCEEDED"), record  # the server ran it, no client
        assert "this client lets go of it" in out
        progress: dict[str, int] = {}
        event = follow_operation(spark_connect.url, record, None, threading.Event(), None, progress)
        assert event["status"] in (DONE, GONE), event  # gone: it ended and the server forgot it before we came
        if event["status"] == DONE:  # the stream replayed from its start: the server's progress reports in it
            assert progress["reports"] >= 1, progress  # periodic: the last need not show the final task finished
            assert progress["tasks"] == record["count"], (progress, record)
            assert 0 <= progress["finished"] <= progress["tasks"], progress
        events.append(event)
        env[detach.DONE_ENV] = json.dumps({**event, "call": record["call"], "operation_id": record["operation_id"]})
        assert len(detached) < 5, (detached, events)
    assert rc == 0, out[-3000:]
    assert [r["call"] for r in detached] == [f"00-pack-{detached[0]['count']}"]  # the job's one Spark call
    assert detached[0]["partitions"] == detached[0]["count"] > 1  # every partition ran detached
    assert "were kept by the detached run" in out  # the client run again asked Spark for nothing
    assert _shards(s3_server, f"tests/detached-{run}") == _shards(s3_server, f"tests/attached-{run}")
    assert not detach.run_results(run).have()  # the run's results went with its last client
    if state == "local":
        assert not Path(detach.run_results(run).url).exists()
    else:  # nothing of the run left in the state store: results, the pinned parallelism, the staged plan
        listed = s3_server.settings().client().list_objects_v2(Bucket="imgest", Prefix=f"tests/state-{run}/staging/")
        assert listed.get("KeyCount", 0) == 0, [o["Key"] for o in listed.get("Contents", [])]
