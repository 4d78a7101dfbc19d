"""Executors that share no disk with the driver: the Spark workers run in private mount namespaces with an empty
tmpfs over the driver's work folders and over the submitting venv's bin/ (as machines of a real cluster would not
see them; their Python comes with each job, IMGEST_SPARK_PYENV=ship), the source is only on S3. With
``$IMGEST_STATE_URL`` the driver stages the manifest (Cassandra target) and the shard plan (shards target) in
object storage and both jobs store exactly what a one-machine run stores; without it, the job fails naming the
file the executor could not see and the setting that avoids it."""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from imgest.core.paths import state_dir
from imgest.core.settings import CassandraSettings, S3Settings
from imgest.services.cassandra import CassandraServer
from imgest.services.s3 import S3Server
from imgest.services.spark_cluster import SparkCluster
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.s3objects import list_objects
from tests.jobs.test_s3_sources import source, upload  # noqa: F401  (the source bucket's fixture)

pytestmark = [pytest.mark.services, pytest.mark.slow]


@pytest.fixture
def hidden_cluster(spark_cluster: SparkCluster, tmp_path: Path) -> Iterator[SparkCluster]:
    """The suite's cluster with its workers restarted where TMP_PATH, $IMGEST_HOME/work and this venv's bin/ are
    empty tmpfs; the usual workers again afterwards."""
    work = state_dir() / "work"
    work.mkdir(parents=True, exist_ok=True)
    venv_bin = str(Path(sys.executable).parent)  # the submitting Python: executors get theirs with the job
    hidden = replace(spark_cluster, hide=(str(tmp_path), str(work), venv_bin))
    hidden.restart_workers()
    try:
        yield hidden
    finally:
        spark_cluster.restart_workers()
        for i in range(1, spark_cluster.workers + 1):  # the unpacked environments (290 MB per executor)
            for env in spark_cluster.worker_dirs(i)[0].glob("app-*/*/imgest-env"):
                shutil.rmtree(env, ignore_errors=True)


def _stored_shards(client: Any, prefix: str) -> tuple[list[tuple[str, int, str]], list[tuple[str, int]]]:
    """(name, samples, sha256 of the tar) of every published shard, and (id, label) of every sample listed."""
    doc = json.loads(client.get_object(Bucket="imgest", Key=f"{prefix}manifest.json")["Body"].read())
    body = client.get_object(Bucket="imgest", Key=f"{prefix}{doc['samples_table']}")["Body"].read()
    table = pq.read_table(pa.BufferReader(body))
    shards = sorted((s["name"], s["samples"], s["sha256"]) for s in doc["shards"])
    return shards, sorted(zip(table.column("id").to_pylist(), table.column("label").to_pylist(), strict=True))


def _stored_rows(settings: CassandraSettings, keyspace: str) -> list[tuple[str, int, str]]:
    with cassandra_session(settings) as session:
        data = {
            r.id: hashlib.sha256(r.data).hexdigest() for r in session.execute(f"SELECT id, data FROM {keyspace}.data")
        }
        meta = session.execute(f"SELECT id, label FROM {keyspace}.metadata")
        return sorted((str(r.id), r.label, data[r.id]) for r in meta)


def test_jobs_on_executors_that_see_no_driver_file(
    source: S3Settings,  # noqa: F811
    s3_server: S3Server,
    cassandra_server: CassandraServer,
    hidden_cluster: SparkCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    from imgest.cli import main

    spec = SampleSpec("imagefolder", classes=3, per_class=5, val_per_class=2, seed=41, defects=True)
    write_sample(tmp_path / "tree", spec)
    url = upload(source, tmp_path / "tree", "tests/no-shared-disk/")
    shutil.rmtree(tmp_path / "tree")
    client, run = s3_server.settings().client(), secrets.token_hex(3)
    ks = {"local": f"nsd_local_{run}", "cluster": f"nsd_cluster_{run}"}
    common = ["--consistency", "ONE", "--port", str(cassandra_server.native_port)]

    def ingest(where: str, target: str, *extra: str) -> int:
        work = ["--work-dir", str(tmp_path / f"work-{where}-{target}-{secrets.token_hex(2)}")]
        master = ["--master", "local[2]" if where == "local" else hidden_cluster.master_url]
        if target == "cassandra":
            return main(["ingest", "cassandra", url, *work, *master, "--keyspace", ks[where], *common, *extra])
        return main(["ingest", "shards", url, *work, *master, "--dest", f"s3://imgest/tests/nsd-{where}-{run}", *extra])

    assert ingest("local", "cassandra") == 0  # the one-machine run: the reference
    assert ingest("local", "shards", "--max-count", "6") == 0
    capfd.readouterr()

    monkeypatch.setenv("IMGEST_SPARK_PYENV", "ship")  # the executors' Python goes with each job (spark.archives)
    monkeypatch.delenv("IMGEST_STATE_URL", raising=False)  # no opt-in: the state goes beside an S3 destination
    assert ingest("cluster", "cassandra") != 0  # no S3 destination to put it beside: refused before any work
    failed = capfd.readouterr()
    assert "IMGEST_STATE_URL=s3://bucket/prefix" in failed.out + failed.err
    assert ingest("cluster", "shards", "--max-count", "6") == 0
    derived = capfd.readouterr()
    assert (
        derived.out.count("for the executors at s3://imgest/_imgest-state/staging/")
        + derived.err.count("for the executors at s3://imgest/_imgest-state/staging/")
        == 1
    )  # the plan went through the store beside the destination, with nobody opting in

    monkeypatch.setenv("IMGEST_STATE_URL", f"s3://imgest/tests/nsd-state-{run}")
    assert ingest("cluster", "cassandra") == 0
    staged = capfd.readouterr()
    assert (
        staged.err.count(f"for the executors at s3://imgest/tests/nsd-state-{run}/staging/")
        + staged.out.count(f"for the executors at s3://imgest/tests/nsd-state-{run}/staging/")
        == 1
    )  # the manifest (cassandra) went through the store
    assert list(list_objects(client, "imgest", f"tests/nsd-state-{run}/staging/")) == []  # removed when the jobs ended

    settings = CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)
    local_rows = _stored_rows(settings, ks["local"])
    assert len(local_rows) == spec.classes * (spec.per_class + spec.val_per_class) + 8  # + the valid planted ones
    assert _stored_rows(settings, ks["cluster"]) == local_rows
    local_shards = _stored_shards(client, f"tests/nsd-local-{run}/")
    assert _stored_shards(client, f"tests/nsd-cluster-{run}/") == local_shards  # byte-identical tars, same samples
    assert sorted((i, label) for i, label, _ in local_rows) == local_shards[1]
