"""Every reader stopped at 40 % of an epoch and restored, with the same and another number of ranks (2 -> 3),
delivers the rest of the epoch: the union of delivered ids is the epoch's, none twice, bytes as ingested."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from imgest.readback.api import get_cassandra_reader
from imgest.readback.cassandra import CassandraReader, CassandraReadOptions
from imgest.readback.datasets import ReadSet, cassandra_set, files_set, shards_set
from imgest.readback.pipelines import PipelineSpec, external_pipeline, file_pipeline, webdataset_pipeline
from imgest.readback.resumable import (
    CassandraResume,
    Delivered,
    FilesResume,
    ShardResume,
    folder_fetch,
    s3_fetch,
    shard_units,
)
from imgest.readback.resume import ReaderState
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sinks.cassandra.schema import TableLayout
from imgest.sinks.shards.store import open_store
from tests.readback.conftest import DATASET, KEYSPACE

pytestmark = [pytest.mark.services, pytest.mark.slow]
STOP = 0.4  # each rank stops consuming at 40 % of its part of the epoch
Reader = Callable[[ReaderState, int], "_Batches"]  # (state, rank) -> that rank's batches


def _sha(image: np.ndarray) -> str:
    return hashlib.sha256(image.tobytes()).hexdigest()


class Ledger:
    """Everything delivered, checked against what was ingested: (label, sha256) per id."""

    def __init__(self, expected: dict[str, tuple[int, str]]) -> None:
        self.expected, self.ids = expected, Counter[str]()

    def take(self, batch: Delivered) -> None:
        for image, label, key, stored in zip(batch.images, batch.labels, batch.ids, batch.sha256, strict=True):
            want_label, want_sha = self.expected[key]
            assert (int(label), _sha(image)) == (want_label, want_sha), key
            assert stored in (None, want_sha), key
            self.ids[key] += 1

    def check_epoch(self) -> None:
        assert [k for k, n in self.ids.items() if n > 1] == [], "delivered twice"
        assert set(self.ids) == set(self.expected)


def _expected(rs: ReadSet) -> dict[str, tuple[int, str]]:
    return {
        i: (int(lab), bytes(sha).hex())
        for i, lab, sha in zip(rs.id_list(), rs.labels.tolist(), rs.rows["sha256"], strict=True)
    }


def _stop_and_restore(read: Reader, ledger: Ledger, world_after: int) -> dict[str, Any]:
    """Two ranks read until 40 % of their parts, their states merged and saved as JSON; WORLD_AFTER ranks restored
    from it read the rest. Returns the saved document."""
    start = ReaderState(seed=7, world_size=2)
    states = []
    for rank in range(2):
        mine = ReaderState.from_state_dict(start.state_dict())
        batches = read(mine, rank)
        total = len(mine.assignment(batches.units, rank))
        got = 0
        for batch in batches:
            ledger.take(batch)
            got += len(batch)
            if got >= STOP * total:
                break
        batches.close()
        states.append(mine)
    saved = json.dumps(ReaderState.merge(states).state_dict())
    assert len(saved) < 2_000, saved  # a small document beside the model checkpoint
    restored = ReaderState.from_state_dict(json.loads(saved))
    assert 0.3 < restored.delivered() / len(ledger.expected) < 0.6, restored.state_dict()
    restored.set_world_size(world_after)
    for rank in range(world_after):
        for batch in read(ReaderState.from_state_dict(restored.state_dict()), rank):
            ledger.take(batch)
    return json.loads(saved)


class _Batches:
    """A reader's batches for one rank, with its units (so the test knows the size of the rank's part)."""

    def __init__(self, resume: Any) -> None:
        self.units = resume.units
        self._it = resume.batches()

    def __iter__(self) -> Iterator[Delivered]:
        return self._it

    def close(self) -> None:
        self._it.close()


@pytest.fixture(scope="module")
def cassandra_rs(stored: dict[str, Any]) -> ReadSet:
    with cassandra_session(stored["cassandra"]) as session:
        return cassandra_set(session, TableLayout(KEYSPACE), DATASET)


@pytest.mark.parametrize("world_after", [2, 3])
def test_cassandra_reader_resumes(stored: dict[str, Any], cassandra_rs: ReadSet, world_after: int) -> None:
    rs = cassandra_rs
    opts = CassandraReadOptions(batch_size=4, rows_per_request=3)  # rows land out of order inside the window
    readers: list[CassandraReader] = []

    def read(state: ReaderState, rank: int) -> Any:
        reader = CassandraReader(stored["cassandra"], rs.table, rs.ids, rs.labels, opts)
        readers.append(reader)
        return _Batches(CassandraResume(reader, state, rank))

    ledger = Ledger(_expected(rs))
    try:
        _stop_and_restore(read, ledger, world_after)
    finally:
        for reader in readers:
            reader.close()
    ledger.check_epoch()


@pytest.mark.parametrize("where", ["folder", "s3"])
def test_shard_readers_resume_with_more_ranks(stored: dict[str, Any], where: str) -> None:
    store = open_store(str(stored["shards"])) if where == "folder" else open_store(stored["s3"], stored["s3_settings"])
    units = shard_units(store.read_manifest())
    assert len(units.sizes) >= 4, "the test needs several shards"
    if where == "folder":
        fetch = folder_fetch(stored["shards"])
    else:
        bucket, _, prefix = stored["s3"][len("s3://") :].partition("/")
        fetch = s3_fetch(stored["s3_settings"], bucket, prefix)
    expected = {}
    for samples in fetch([(str(n), int(s)) for n, s in zip(units.names, units.sizes, strict=True)]):
        for image, label, _, meta in samples:  # what the ingest recorded in each sample's .json
            assert _sha(image) == meta["sha256"]
            expected[meta["id"]] = (label, meta["sha256"])
    assert set(expected) == set(shards_set(store).id_list())
    for world_after in (2, 3):
        ledger = Ledger(expected)
        saved = _stop_and_restore(
            lambda state, rank: _Batches(ShardResume(units, fetch, state, rank, batch_size=4)),
            ledger,
            world_after,
        )
        ledger.check_epoch()
        assert saved["fingerprint"] == units.fingerprint


def test_files_reader_resumes_with_more_ranks(stored: dict[str, Any]) -> None:
    rs = files_set(stored["files"])
    for world_after in (2, 3):
        ledger = Ledger(_expected(rs))
        _stop_and_restore(
            lambda state, rank: _Batches(FilesResume(rs.paths, rs.labels, rs.ids, state, rank, 4)),
            ledger,
            world_after,
        )
        ledger.check_epoch()


def _run_source(pipe: Any, source: Any, by_sha: dict[str, str], seen: Counter[str], steps: int | None) -> None:
    """Run PIPE for STEPS batches (None: to the end of the epoch), recording each image's id by its sha256."""
    done = 0
    while steps is None or done < steps:
        try:
            images, _ = pipe.run()
        except StopIteration:
            return
        source.consumed()
        for i in range(len(images)):
            seen[by_sha[_sha(np.array(images.at(i)))]] += 1
        done += 1


def test_get_cassandra_reader_resumes_inside_dali(stored: dict[str, Any], cassandra_rs: ReadSet) -> None:
    """The public source: DALI asks for batches ahead, ``consumed()`` after each run keeps the state exact."""
    rs = cassandra_rs
    by_sha = {sha: key for key, (_, sha) in _expected(rs).items()}
    assert len(by_sha) == len(rs), "the test identifies images by sha256: they must differ"
    seen: Counter[str] = Counter()
    spec = PipelineSpec(batch_size=4, num_threads=1)
    common = {"ids": rs.id_list(), "labels": rs.labels.tolist(), "settings": stored["cassandra"], "batch_size": 4}
    states = []
    for rank in range(2):
        state = ReaderState(seed=3, world_size=2)
        source = get_cassandra_reader(rs.table, state=state, shard_id=rank, num_shards=2, **common)
        _run_source(external_pipeline(spec, source), source, by_sha, seen, steps=3)  # 12 of 30 rows: 40 %
        states.append(source.state_dict())
        source.close()
    saved = json.dumps(ReaderState.merge(states).state_dict())
    assert sum(seen.values()) == 24
    for rank in range(3):
        state = ReaderState.from_state_dict(json.loads(saved))
        source = get_cassandra_reader(rs.table, state=state, shard_id=rank, num_shards=3, **common)
        pipe = external_pipeline(spec, source)
        _run_source(pipe, source, by_sha, seen, steps=None)
        if rank == 2:  # after the epoch's StopIteration, the next call starts the state's next epoch
            pipe.reset()
            _run_source(pipe, source, by_sha, Counter(), steps=1)
            assert state.epoch == 1
            assert state.samples_done() == [0, 0, 4]
            assert state.history == []
        source.close()
    assert [k for k, n in seen.items() if n > 1] == []
    assert set(seen) == set(rs.id_list())


def _dali_ids(pipe: Any, meta_at: int | None, rs: ReadSet, batches: int) -> list[str]:
    by_sha = {sha: key for key, (_, sha) in _expected(rs).items()} if meta_at is None else {}
    out = []
    for _ in range(batches):
        o = pipe.run()
        for i in range(len(o[0])):
            if meta_at is None:
                out.append(by_sha[_sha(np.array(o[0].at(i)))])
            else:
                out.append(json.loads(np.array(o[meta_at].at(i)).tobytes())["id"])
    return out


@pytest.mark.parametrize("reader", ["files", "shards-folder"])
def test_dali_readers_resume_from_their_checkpoint(stored: dict[str, Any], reader: str) -> None:
    """DALI's own readers: enable_checkpointing, pipe.checkpoint() at 40 %, a new pipeline restored from it. DALI
    restores the same shard_id / num_shards only: the elastic 2 -> 3 restore is imgest's readers' job."""
    spec = PipelineSpec(batch_size=8, num_threads=1, checkpointing=True)
    shuffle = {"random_shuffle": True, "seed": 5}
    if reader == "files":
        rs = files_set(stored["files"])
        meta_at = None

        def build(checkpoint: str | None) -> Any:
            return file_pipeline(spec, rs.paths, rs.labels.tolist(), checkpoint, **shuffle)

    else:
        rs = shards_set(open_store(str(stored["shards"])))
        paths = [f"{stored['shards']}/{s}" for s in rs.shards]
        meta_at = 2

        def build(checkpoint: str | None) -> Any:
            return webdataset_pipeline(spec, paths, [p[:-4] + ".idx" for p in paths], checkpoint, **shuffle)

    pipe = build(None)
    n = pipe.epoch_size("Reader")
    assert n == len(rs)
    first = _dali_ids(pipe, meta_at, rs, 3)  # 24 of 60: 40 %
    checkpoint = pipe.checkpoint()
    restored = build(checkpoint)
    rest = _dali_ids(restored, meta_at, rs, -(-(n - len(first)) // 8))[: n - len(first)]  # the rest pads the batch
    assert sorted(first + rest) == sorted(rs.id_list())
