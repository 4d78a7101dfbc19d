"""Every reader returns exactly the stored bytes and labels of one version, through the same DALI pipeline."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from imgest.readback.cassandra import CassandraReader, CassandraReadOptions
from imgest.readback.cassandra_base import ReadError
from imgest.readback.check import ReadCheckOptions, cassandra_runs, files_runs, folder_shard_runs
from imgest.readback.check_s3 import s3_shard_runs, s3_stream_run
from imgest.readback.datasets import NotReadableError, cassandra_set, files_set, shards_set
from imgest.readback.pipelines import PipelineSpec, cuda_devices
from imgest.readback.s3shards import S3ShardStream, S3StreamOptions, ShardReadError
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sinks.cassandra.schema import TableLayout
from imgest.sinks.shards.store import open_store
from tests.readback.conftest import DATASET, KEYSPACE

pytestmark = [pytest.mark.services, pytest.mark.slow]
OPTS = ReadCheckOptions(batch_size=8)


def _cassandra(stored: dict[str, Any]) -> Any:
    with cassandra_session(stored["cassandra"]) as session:
        return cassandra_set(session, TableLayout(KEYSPACE), DATASET)


def _check(results: list[Any], readers: set[str], n: int) -> None:
    assert {r.reader for r in results} == readers
    for r in results:
        assert r.ok, (r.reader, r.mode, r.problems)
        assert r.images == n, (r.reader, r.mode)
        # the rate is that of the epoch read: seconds are kept to the millisecond (the rate was computed before that
        # rounding, to 0.1), so it lies between images / (seconds + 0.5 ms) and images / (seconds - 0.5 ms)
        low, high = r.images / (r.seconds + 0.0005), r.images / max(r.seconds - 0.0005, 1e-9)
        assert low - 0.1 <= r.images_per_s <= high + 0.1, (r.reader, r.mode, r.images_per_s, r.seconds)
    assert {r.mode for r in results} == {"raw", "train"}


def test_files_and_folder_shards_read_back_exactly(stored: dict[str, Any]) -> None:
    rs = files_set(stored["files"])
    assert len(rs) == stored["train"]
    _check(files_runs(rs, OPTS), {"files"}, stored["train"])
    shards = shards_set(open_store(str(stored["shards"])))
    _check(folder_shard_runs(shards, str(stored["shards"]), OPTS), {"shards-folder"}, stored["train"])


def test_s3_readers_read_back_exactly(stored: dict[str, Any]) -> None:
    s3 = stored["s3_settings"]
    rs = shards_set(open_store(stored["s3"], s3))
    results, failed = s3_shard_runs(rs, s3, "imgest", "tests/readback", OPTS)
    # s3_shard_runs records a failure of DALI's s3:// reader and goes on (a benchmark reports it); here it fails:
    # the pinned DALI reads s3:// on every machine of this project, so no failure of it is a known limitation
    assert failed == [], f"DALI's s3:// reader failed: {failed}"
    _check(results, {"shards-s3-dali", "shards-s3-stream", "shards-s3-webdataset"}, stored["train"])


def test_cassandra_readers_read_back_exactly(stored: dict[str, Any]) -> None:
    rs = _cassandra(stored)
    assert len(rs) == stored["train"]
    _check(cassandra_runs(stored["cassandra"], rs, OPTS), {"cassandra", "cassandra-simple"}, stored["train"])


def test_cassandra_shards_are_disjoint_cover_and_reshuffle_per_epoch(stored: dict[str, Any]) -> None:
    rs = _cassandra(stored)
    epochs: list[list[list[str]]] = [[], []]  # epoch -> shard -> ids in read order
    for shard in range(3):
        opts = CassandraReadOptions(batch_size=7, shard_id=shard, num_shards=3, seed=5, rows_per_request=4)
        with CassandraReader(stored["cassandra"], rs.table, rs.ids, rs.labels, opts) as reader:
            for epoch in epochs:
                epoch.append([i for _, _, ids in reader.epoch_batches() for i in ids])
    for parts in epochs:  # every epoch: the shards' parts are disjoint and cover the version
        assert sum(len(p) for p in parts) == len(rs)
        assert set().union(*map(set, parts)) == set(rs.id_list())
    assert epochs[0] != epochs[1]  # a new seeded order each epoch
    by_id = dict(zip(rs.id_list(), rs.labels.tolist(), strict=True))
    with CassandraReader(stored["cassandra"], rs.table, rs.ids, rs.labels, CassandraReadOptions(batch_size=9)) as r:
        for images, labels, ids in r.epoch_batches():
            assert [by_id[i] for i in ids] == labels.tolist()
            assert all(img.dtype == np.uint8 and img.size > 0 for img in images)


def test_corrupted_file_and_row_are_named(stored: dict[str, Any], copy_of: Any) -> None:
    files = copy_of(stored["files"])
    rs = files_set(files)
    victim = Path(rs.paths[3])
    victim.write_bytes(victim.read_bytes()[:-10] + b"0123456789")
    result = files_runs(rs, replace(OPTS, modes=("raw",)))[0]
    assert not result.ok
    assert any(p.startswith(f"{rs.id_list()[3]}: sha256") for p in result.problems), result.problems

    crs = _cassandra(stored)
    table = "data_corrupt"
    with cassandra_session(stored["cassandra"]) as session:
        session.execute(f"CREATE TABLE IF NOT EXISTS {KEYSPACE}.{table} (id uuid PRIMARY KEY, label int, data blob)")
        for row in session.execute(f"SELECT id, label, data FROM {crs.table}"):
            data = b"garbage" if str(row.id) == crs.id_list()[5] else row.data
            session.execute(
                f"INSERT INTO {KEYSPACE}.{table} (id, label, data) VALUES (%s, %s, %s)", (row.id, row.label, data)
            )
    bad = replace(crs, table=f"{KEYSPACE}.{table}")
    result = cassandra_runs(stored["cassandra"], bad, replace(OPTS, modes=("raw",)), baseline=False)[0]
    assert not result.ok
    assert any(p.startswith(f"{crs.id_list()[5]}: sha256") for p in result.problems), result.problems


def test_missing_row_and_object_are_errors_naming_them(stored: dict[str, Any]) -> None:
    rs = _cassandra(stored)
    ghost = str(uuid.uuid4())
    opts = CassandraReadOptions(batch_size=8, rows_per_request=4)
    with (
        CassandraReader(stored["cassandra"], rs.table, [*rs.id_list()[:5], ghost], [*rs.labels[:5], 0], opts) as reader,
        pytest.raises(ReadError, match=ghost),
    ):
        list(reader.epoch_batches())
    stream = S3ShardStream(
        stored["s3_settings"], "imgest", ["tests/readback/train-999999.tar"], S3StreamOptions(retries=1)
    )
    with pytest.raises(ShardReadError, match=r"train-999999\.tar"):
        list(stream.epoch_batches())


def test_wrong_s3_key_is_a_clear_error(stored: dict[str, Any]) -> None:
    wrong = replace(stored["s3_settings"], secret_key="not-the-secret")
    rs = shards_set(open_store(stored["s3"], stored["s3_settings"]))
    with pytest.raises(ShardReadError) as err:
        s3_stream_run(rs, wrong, "imgest", "tests/readback", PipelineSpec(8), S3StreamOptions(retries=0))
    assert "SignatureDoesNotMatch" in str(err.value) or "AccessDenied" in str(err.value)
    assert "not-the-secret" not in str(err.value)


def test_incomplete_version_is_refused_unless_asked(stored: dict[str, Any], copy_of: Any) -> None:
    with cassandra_session(stored["cassandra"]) as session:
        version = _cassandra(stored).version
        session.execute(
            f"INSERT INTO {KEYSPACE}.dataset_versions (dataset, version, status) VALUES ('half', 'v1', 'writing')"
        )
        with pytest.raises(NotReadableError, match="no complete version"):
            cassandra_set(session, TableLayout(KEYSPACE), "half")
        assert cassandra_set(session, TableLayout(KEYSPACE), "half", allow_incomplete=True).version == "v1"
    assert version
    unpublished = copy_of(stored["files"])
    (unpublished / "manifest.json").unlink()
    with pytest.raises(NotReadableError, match=r"manifest\.json is missing"):
        files_set(unpublished)
    doc = json.loads((stored["files"] / "manifest.json").read_text())
    assert doc["format"] == "files"


def test_readme_example_reads_a_split_part(stored: dict[str, Any], tmp_path: Path) -> None:
    import subprocess
    import sys

    from imgest.cli import main as cli
    from imgest.splits import load_split

    split_file = tmp_path / "split.npz"
    port = str(stored["cassandra"].port)
    argv = ["split", "--metadata-table", f"{KEYSPACE}.metadata", "--data-table", f"{KEYSPACE}.data"]
    assert cli([*argv, "--port", port, "--split-of", "train", "-r", "3,1", "-o", str(split_file)]) == 0
    expected = len(load_split(split_file).part(0)[0])
    example = Path(__file__).parents[2] / "examples" / "read_cassandra.py"
    env = {
        "IMGEST_CASSANDRA_HOSTS": stored["cassandra"].hosts[0],
        "IMGEST_CASSANDRA_PORT": port,
        "PATH": "/usr/bin:/bin",
    }
    out = subprocess.run(
        [
            sys.executable,
            str(example),
            "--table",
            f"{KEYSPACE}.data",
            "--split-file",
            str(split_file),
            "--batch-size",
            "8",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    assert f"read {expected} images" in out


@pytest.mark.gpu
@pytest.mark.skipif(cuda_devices() == 0, reason="needs an NVIDIA GPU for DALI's mixed decoder")
def test_mixed_decoding_on_gpu_reads_back_exactly(stored: dict[str, Any]) -> None:
    gpu = replace(OPTS, device_id=0, modes=("train",))
    _check_gpu = files_runs(files_set(stored["files"]), gpu) + cassandra_runs(
        stored["cassandra"], _cassandra(stored), gpu, baseline=False
    )
    for r in _check_gpu:
        assert r.device == "gpu"
        assert r.ok, (r.reader, r.problems)
        assert r.images == stored["train"]
