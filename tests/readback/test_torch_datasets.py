"""The PyTorch datasets (imgest[torch]) over shards in a folder and on S3, Cassandra rows and files: 2 ranks of a
DataLoader with 2 workers stop at 40 % of the epoch, 3 ranks restored from the saved state read the rest; every
id of the epoch exactly once, bytes and labels as ingested."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="imgest[torch] is part of the dev install (requirements/torch.txt)")

from torch.utils.data import DataLoader  # noqa: E402

from imgest.readback.datasets import ReadSet, cassandra_set, files_set  # noqa: E402
from imgest.readback.resumable import folder_fetch, s3_fetch, shard_units  # noqa: E402
from imgest.readback.resume import ReaderState  # noqa: E402
from imgest.readback.torchdata import (  # noqa: E402
    CassandraDataset,
    FilesDataset,
    ShardDataset,
    collate,
    tracked,
)
from imgest.sinks.cassandra.client import cassandra_session  # noqa: E402
from imgest.sinks.cassandra.schema import TableLayout  # noqa: E402
from imgest.sinks.shards.store import open_store  # noqa: E402
from tests.readback.conftest import DATASET, KEYSPACE  # noqa: E402

pytestmark = [pytest.mark.services, pytest.mark.slow]
Make = Callable[[ReaderState, int], Any]  # (state, rank) -> dataset


def _loader(dataset: Any) -> DataLoader:
    return DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=collate)


def _sha(image: Any) -> str:
    return hashlib.sha256(image.numpy().tobytes()).hexdigest()


def _epoch(make: Make, expected: dict[str, tuple[int, str]]) -> dict[str, Any]:
    """Stop two ranks at 40 %, save, restore three; check the epoch. Returns the saved state."""
    seen: Counter[str] = Counter()
    workers: dict[str, set[int]] = {}

    def take(batch: dict[str, Any]) -> None:
        columns = (batch["images"], batch["labels"].tolist(), batch["ids"], batch["sha256"])
        for image, label, key, stored in zip(*columns, strict=True):
            assert (label, _sha(image)) == expected[key], key
            assert stored in ("", expected[key][1]), key
            seen[key] += 1

    states = []
    for rank in range(2):
        state = ReaderState(seed=11, world_size=2)
        dataset = make(state, rank)
        part = len(state.assignment(dataset.units, rank))
        halves = [set(state.assignment(dataset.units, rank, w, 2).offset.tolist()) for w in range(2)]
        assert halves[0]
        assert halves[1]
        assert not halves[0] & halves[1]  # the two workers' shares are disjoint
        workers[f"rank{rank}"] = {len(h) for h in halves}
        got = 0
        for batch in tracked(_loader(dataset), state, rank):
            take(batch)
            got += len(batch["ids"])
            if got >= 0.4 * part:
                break
        states.append(state)
    saved = ReaderState.merge(states).state_dict()
    assert sum(seen.values()) == sum(saved["samples_done"])
    assert 0.3 < sum(seen.values()) / len(expected) < 0.6
    restored = ReaderState.from_state_dict(json.loads(json.dumps(saved)))
    restored.set_world_size(3)
    for rank in range(3):
        state = ReaderState.from_state_dict(restored.state_dict())
        for batch in tracked(_loader(make(state, rank)), state, rank):
            take(batch)
        assert len(state.assignment(make(state, rank).units, rank)) == 0  # the rank's part is done
    assert [k for k, n in seen.items() if n > 1] == []
    assert set(seen) == set(expected)
    return saved


def _expected(rs: ReadSet) -> dict[str, tuple[int, str]]:
    return {
        i: (int(lab), bytes(sha).hex())
        for i, lab, sha in zip(rs.id_list(), rs.labels.tolist(), rs.rows["sha256"], strict=True)
    }


@pytest.mark.parametrize("where", ["folder", "s3"])
def test_shard_dataset_resumes_with_workers_and_more_ranks(stored: dict[str, Any], where: str) -> None:
    s3 = stored["s3_settings"]
    location = str(stored["shards"]) if where == "folder" else stored["s3"]
    units = shard_units(open_store(location, s3 if where == "s3" else None).read_manifest())
    if where == "folder":
        fetch = folder_fetch(location)
    else:
        bucket, _, prefix = location[len("s3://") :].partition("/")
        fetch = s3_fetch(s3, bucket, prefix)
    expected = {}
    for samples in fetch([(str(n), int(k)) for n, k in zip(units.names, units.sizes, strict=True)]):
        for image, label, _, meta in samples:  # the sha256 the ingest wrote into each sample's .json
            assert hashlib.sha256(image.tobytes()).hexdigest() == meta["sha256"]
            expected[meta["id"]] = (label, meta["sha256"])
    saved = _epoch(lambda state, rank: ShardDataset(location, state, rank, s3=s3), expected)
    assert saved["fingerprint"] == units.fingerprint


def test_cassandra_dataset_resumes_with_workers_and_more_ranks(stored: dict[str, Any]) -> None:
    with cassandra_session(stored["cassandra"]) as session:
        rs = cassandra_set(session, TableLayout(KEYSPACE), DATASET)
    _epoch(
        lambda state, rank: CassandraDataset(
            rs.table, rs.ids, rs.labels, state, rank, settings=stored["cassandra"], batch_size=4, rows_per_request=2
        ),
        _expected(rs),
    )


def test_files_dataset_resumes_and_decodes(stored: dict[str, Any]) -> None:
    rs = files_set(stored["files"])
    _epoch(lambda state, rank: FilesDataset(rs.paths, rs.labels, rs.ids, state, rank), _expected(rs))
    decoded = FilesDataset(rs.paths, rs.labels, rs.ids, ReaderState(), decode=True)
    image, label, key, offset, _ = next(iter(decoded))
    assert image.dtype == torch.uint8
    assert image.ndim == 3
    assert image.shape[0] == 3
    assert offset == 0
    assert label == dict(zip(rs.id_list(), rs.labels.tolist(), strict=True))[key]
    assert np.asarray(image).size > 0


def test_bench_runs_verify_the_torch_datasets(stored: dict[str, Any]) -> None:
    """What `imgest bench read` reports beside webdataset's loader: every sample verified, through DALI."""
    from imgest.readback.check import ReadCheckOptions
    from imgest.readback.datasets import shards_set
    from imgest.readback.torchcheck import torch_runs

    with cassandra_session(stored["cassandra"]) as session:
        rows = cassandra_set(session, TableLayout(KEYSPACE), DATASET)
    sets = {"s3": shards_set(open_store(stored["s3"], stored["s3_settings"])), "cassandra": rows}
    opts = ReadCheckOptions(batch_size=8, modes=("raw",), num_threads=1)
    results = torch_runs(sets, stored["s3"], stored["cassandra"], stored["s3_settings"], opts)
    assert [r.reader for r in results] == ["torch-shards-s3", "torch-cassandra"]
    for result in results:
        assert result.ok, (result.reader, result.problems)
        assert result.images == stored["train"]
        assert result.settings["num_workers"] == 2
