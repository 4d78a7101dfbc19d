"""imgest.core.idset: a set of ids built once answers exactly what ``pc.is_in`` answers, batch after batch (issue #41):
UUID strings, ids of any length (empty, with NUL bytes, longer than every member), nulls, slices, chunked and large
string arrays, and hashes that collide."""

from __future__ import annotations

import uuid

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imgest.core import idset
from imgest.core.idset import IdSet


def _expected(values: pa.Array, ids: pa.Array | pa.ChunkedArray) -> list[bool]:
    return pc.is_in(ids, value_set=values, skip_nulls=True).to_pylist()


def test_uuid_batches_match_is_in() -> None:
    rng = np.random.default_rng(3)
    ids = [str(uuid.UUID(bytes=rng.bytes(16))) for _ in range(5000)]
    members = pa.array([ids[i] for i in rng.choice(5000, 700, replace=False)])
    found = IdSet(members)
    for start in range(0, 5000, 1024):
        batch = pa.array(ids[start : start + 1024])
        assert found.contains(batch).to_pylist() == _expected(members, batch)
    assert sum(found.contains(pa.array(ids)).to_pylist()) == 700


NASTY = ["", "a", "a\0", "a\0\0", "\0", "b", "ab", "ba", "x" * 40, "train-000001", "é", None]


@given(
    members=st.lists(st.sampled_from(NASTY) | st.text(max_size=12), max_size=30),
    asked=st.lists(st.sampled_from(NASTY) | st.text(max_size=14), max_size=40),
)
@settings(max_examples=300, deadline=None)
def test_any_strings_match_is_in(members: list[str | None], asked: list[str | None]) -> None:
    values, ids = pa.array(members, pa.string()), pa.array(asked, pa.string())
    assert IdSet(values).contains(ids).to_pylist() == _expected(values, ids)


def test_slices_chunks_and_large_strings() -> None:
    values = pa.array(["b", "dd", "a", "ccc"])
    ids = pa.array(["a", "b", "c", "dd", "ccc", "e", None, "b"])
    found = IdSet(pa.chunked_array([values.slice(0, 2), values.slice(2)]))
    assert found.contains(ids.slice(3, 4)).to_pylist() == [True, True, False, False]
    assert found.contains(pa.chunked_array([ids[:2], ids[2:]])).to_pylist() == _expected(values, ids)
    assert found.contains(ids.cast(pa.large_string())).to_pylist() == _expected(values, ids)
    assert IdSet(["a"]).contains(pa.array([], pa.string())).to_pylist() == []
    assert IdSet([]).contains(ids).to_pylist() == [False] * len(ids)
    with pytest.raises(TypeError, match="strings or binary"):
        IdSet(pa.array([1, 2]))


def test_colliding_hashes_compare_whole_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    real = idset._hash
    monkeypatch.setattr(idset, "_hash", lambda matrix: real(matrix) & np.uint64(1))  # two hashes for every id
    values = pa.array([f"id-{i}" for i in range(0, 400, 3)])
    ids = pa.array([f"id-{i}" for i in range(400)] + ["id-", "id-00"])
    assert IdSet(values).contains(ids).to_pylist() == _expected(values, ids)
