"""The dataset lock across hosts: writers on different "hosts" (own hostname, own empty IMGEST_HOME, nothing
shared but the S3 server) race for one dataset through ``$IMGEST_STATE_URL``; exactly one writes, the others are
told who holds it; a holder that died is taken over once its lease runs out, and not before; a holder that stalled
past its lease and was taken over publishes nothing when it wakes up."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from imgest.core import locks
from imgest.core.lock_stores import S3LockStore
from imgest.services.s3 import S3Server
from imgest.sinks.shards.store import S3Store

pytestmark = pytest.mark.services

# One "host": takes the dataset's lock as the CLI does (dataset_lock), and while it holds it writes one marker
# object; then holds on for HOLD seconds (renewing its lease) before it lets go.
CONTENDER = """
import os, sys, time
from imgest.core import locks
from imgest.core.settings import S3Settings
dataset, marker, hold = sys.argv[1], sys.argv[2], float(sys.argv[3])
try:
    with locks.dataset_lock(dataset, "imgest ingest (lock test)") as holder:
        s3 = S3Settings.from_env()
        s3.client().put_object(Bucket=s3.bucket, Key=marker, Body=holder.who.encode())
        print("WROTE", holder.who, flush=True)
        time.sleep(hold)
except locks.DatasetBusyError as e:
    print("BUSY", e, flush=True)
    sys.exit(3)
"""


def _host_env(s3_server: S3Server, home: Path, prefix: str, lease_s: float) -> dict[str, str]:
    settings = s3_server.settings()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMGEST_", "AWS_"))}
    home.mkdir(parents=True)
    return {
        **env,
        "IMGEST_HOME": str(home),  # an empty disk of its own, as a pod gets
        "IMGEST_STATE_URL": f"s3://{s3_server.bucket}/{prefix}",
        "IMGEST_S3_ENDPOINT": str(settings.endpoint_url),
        "IMGEST_S3_BUCKET": s3_server.bucket,
        "AWS_ACCESS_KEY_ID": str(settings.access_key),
        "AWS_SECRET_ACCESS_KEY": str(settings.secret_key),
        "IMGEST_LOCK_LEASE_S": str(lease_s),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }


# A holder that publishes a shard dataset (manifest.json) under the lock, as the CLI does: once at once, then again
# when told to on stdin.
PUBLISHER = """
import sys
from imgest.core import locks
from imgest.sinks.shards.pack_publish import publish
from imgest.sinks.shards.store import open_store
dataset, dest = sys.argv[1], sys.argv[2]
with locks.dataset_lock(dataset, "imgest ingest shards (fence test)") as holder:
    store = open_store(dest)
    publish(store, {"key": "first", "dataset": dataset, "shards": []})
    print("PUBLISHED", holder.who, flush=True)
    sys.stdin.readline()
    try:
        publish(store, {"key": "second", "dataset": dataset, "shards": []})
    except locks.LockLostError as e:
        print("LOST", e, flush=True)
        sys.exit(4)
    print("PUBLISHED AGAIN", flush=True)
"""


def _on_host(name: str, args: list[str], env: dict[str, str], script: str = CONTENDER) -> subprocess.Popen[str]:
    """A process that sees hostname NAME (its own UTS namespace, where unshare can make one)."""
    cmd = [sys.executable, "-c", script, *args]
    if shutil.which("unshare") and os.geteuid() == 0:
        cmd = ["unshare", "-u", "sh", "-c", f'hostname {name} && exec "$@"', "sh", *cmd]
    return subprocess.Popen(
        cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _markers(s3_server: S3Server, prefix: str) -> list[str]:
    client = s3_server.settings().client()
    listed = client.list_objects_v2(Bucket=s3_server.bucket, Prefix=f"{prefix}/writes/")
    return sorted(o["Key"] for o in listed.get("Contents", []))


def test_store_changes_only_what_it_read(s3_server: S3Server) -> None:
    """The server honours the conditional writes the lock is built on (If-None-Match, If-Match on PUT and DELETE)."""
    store = S3LockStore(f"s3://{s3_server.bucket}/locktest-{secrets.token_hex(4)}", s3_server.settings())
    assert store.create("d", {"who": "a"})
    assert not store.create("d", {"who": "b"})  # exists: refused
    first = store.read("d")
    assert first is not None
    assert first.fields == {"who": "a"}
    assert first.age_s < 60
    assert store.replace("d", {"who": "c"}, first.version)
    assert not store.replace("d", {"who": "e"}, first.version)  # changed since it was read: refused
    assert not store.delete("d", first.version)
    now = store.read("d")
    assert now is not None
    assert now.fields == {"who": "c"}
    assert store.names() == ["d"]
    assert store.delete("d", now.version)
    assert store.read("d") is None


def test_hosts_racing_for_one_dataset_exactly_one_writes(s3_server: S3Server, tmp_path: Path) -> None:
    prefix, dataset = f"locktest-{secrets.token_hex(4)}", "imagenet"
    procs = []
    for i in range(6):
        env = _host_env(s3_server, tmp_path / f"host-{i}", prefix, lease_s=60)
        procs.append(_on_host(f"host-{i}", [dataset, f"{prefix}/writes/host-{i}", "3"], env))
    outs = [(p.wait(timeout=120), p.stdout.read() if p.stdout else "") for p in procs]
    winners = [out for rc, out in outs if rc == 0]
    assert len(winners) == 1, outs
    written = _markers(s3_server, prefix)
    assert len(written) == 1, written
    who = winners[0].split("WROTE ", 1)[1].strip()
    assert f"on host-{written[0].rsplit('-', 1)[1]}:" in who  # the marker is the winner's, from its own host
    for rc, out in outs:
        if rc != 0:
            assert rc == 3, out
            assert f"is being written by {who}" in out
    store = S3LockStore(f"s3://{s3_server.bucket}/{prefix}", s3_server.settings())
    assert store.read(dataset) is None  # the winner let go when it finished


def test_dead_holder_is_taken_over_after_its_lease_and_not_before(s3_server: S3Server, tmp_path: Path) -> None:
    prefix, dataset, lease = f"locktest-{secrets.token_hex(4)}", "imagenet", 6.0
    env_a = _host_env(s3_server, tmp_path / "a", prefix, lease_s=lease)
    env_b = _host_env(s3_server, tmp_path / "b", prefix, lease_s=lease)
    holder = _on_host("host-a", [dataset, f"{prefix}/writes/a", "600"], env_a)
    assert holder.stdout is not None
    assert holder.stdout.readline().startswith("WROTE")
    time.sleep(lease * 1.5)  # a live holder renews its lease: still refused after the lease's length
    early = _on_host("host-b", [dataset, f"{prefix}/writes/b", "0"], env_b)
    assert early.wait(timeout=60) == 3
    assert "on host-a:" in (early.stdout.read() if early.stdout else "")
    holder.send_signal(signal.SIGKILL)  # the host is lost: no release, no more renewals
    holder.wait()
    store = S3LockStore(f"s3://{s3_server.bucket}/{prefix}", s3_server.settings())
    held = locks.read(dataset, store)
    assert held is not None
    assert "host-a" in held.holder.who
    assert not held.stale()
    deadline = time.monotonic() + lease * 4
    while not (held := locks.read(dataset, store)) or not held.stale():  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the dead holder's lease never ran out"
        time.sleep(0.5)
    late = _on_host("host-b", [dataset, f"{prefix}/writes/b", "0"], env_b)
    out = late.stdout.read() if late.stdout else ""
    assert late.wait(timeout=60) == 0, out
    assert "WROTE" in out
    assert "on host-b:" in out
    assert "took over the lock of imagenet" in out
    assert "not renewed" in out
    assert _markers(s3_server, prefix) == [f"{prefix}/writes/a", f"{prefix}/writes/b"]


def test_a_stalled_holder_taken_over_publishes_nothing(s3_server: S3Server, tmp_path: Path) -> None:
    """Host A publishes under the lock, then stalls (SIGSTOP: no renewals) past its lease; host B takes the lock
    over. Woken up, A's next publish fails with LockLostError naming B, and manifest.json is still A's first."""
    prefix, dataset, lease = f"locktest-{secrets.token_hex(4)}", "imagenet", 3.0
    dest = f"s3://{s3_server.bucket}/{prefix}/shards"
    env_a = _host_env(s3_server, tmp_path / "a", prefix, lease_s=lease)
    env_b = _host_env(s3_server, tmp_path / "b", prefix, lease_s=60)
    holder = _on_host("host-a", [dataset, dest], env_a, PUBLISHER)
    assert holder.stdin is not None
    assert holder.stdout is not None
    assert holder.stdout.readline().startswith("PUBLISHED"), holder.stdout.read()
    store = S3LockStore(f"s3://{s3_server.bucket}/{prefix}", s3_server.settings())
    shards = S3Store(s3_server.settings(), s3_server.bucket, f"{prefix}/shards")
    holder.send_signal(signal.SIGSTOP)  # a stalled host: its lease is not renewed
    try:
        deadline = time.monotonic() + lease * 4
        while not (held := locks.read(dataset, store)) or not held.stale():  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the stalled holder's lease never ran out"
            time.sleep(0.5)
        taker = _on_host("host-b", [dataset, f"{prefix}/writes/b", "30"], env_b)
        assert taker.stdout is not None
        said = [taker.stdout.readline() for _ in range(2)]
        assert "took over the lock of imagenet from pid" in said[0]
        assert said[1].startswith("WROTE"), said
    finally:
        holder.send_signal(signal.SIGCONT)
    holder.stdin.write("publish again\n")
    holder.stdin.flush()
    out = holder.stdout.read()
    assert holder.wait(timeout=60) == 4, out
    assert "LOST" in out
    assert "lost the write lock of dataset 'imagenet': it is held by pid " in out
    assert "on host-b: imgest ingest (lock test)" in out
    assert (shards.read_manifest() or {})["key"] == "first"  # nothing published after the loss
    now = locks.read(dataset, store)
    assert now is not None
    assert "on host-b:" in now.holder.who  # A's exit left B's lock alone
    taker.terminate()
    taker.wait(timeout=60)


def test_the_cli_and_a_dag_writing_one_destination_share_one_lock(
    s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A DAG run (on a cluster: its lock beside its S3 destination) holds a dataset; `imgest ingest shards` on a
    laptop's local master, with no IMGEST_STATE_URL, writing the same destination, looks in the same place and is
    refused naming the run; `imgest locks --dest` lists and releases it there."""
    from imgest.cli import main
    from imgest.core.run_state import derived_state_url
    from imgest.sources.devdata.sample import SampleSpec, write_sample

    monkeypatch.delenv("IMGEST_STATE_URL", raising=False)
    monkeypatch.delenv("IMGEST_LOCK_URL", raising=False)
    dataset = f"shared-{secrets.token_hex(2)}"
    dest = f"s3://{s3_server.bucket}/lock-test/{dataset}"
    store = S3LockStore(derived_state_url(dest), s3_server.settings())
    run = locks.airflow_holder("ingest_imagenet", "scheduled__cluster", lease_s=600)
    assert locks.try_acquire(dataset, run, store) is None
    write_sample(tmp_path / "src", SampleSpec("imagefolder", classes=2, per_class=2, val_per_class=1, seed=2))
    args = ["ingest", "shards", str(tmp_path / "src"), "--dest", dest, "--dataset", dataset]
    assert main([*args, "--work-dir", str(tmp_path / "work")]) != 0
    err = capsys.readouterr().err
    assert f"dataset {dataset!r} is being written by Airflow DAG ingest_imagenet run scheduled__cluster" in err
    assert "_imgest-state/locks/" in err  # the store it looked in: beside the destination
    assert main(["locks", "--dest", dest]) == 0
    assert f"{dataset}" in capsys.readouterr().out
    assert main(["locks", "release", dataset, "--dest", dest]) == 0
    assert locks.read(dataset, store) is None
