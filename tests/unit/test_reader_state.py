"""The reader state alone (no service): an epoch stopped anywhere, restored with any world size, reads the rest once."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imgest.readback.resume import ReaderState, ResumeError, Units


def _epoch(units: Units, world_sizes: list[int], fraction: float, seed: int = 3) -> tuple[list[tuple[int, int]], str]:
    """Read an epoch in generations of WORLD_SIZES ranks, each rank stopping after FRACTION of its part (the last
    generation reads everything), samples taken out of order; the state goes through JSON between generations.
    Returns the (unit, sample) pairs delivered and the last saved JSON."""
    state, seen, saved = ReaderState(seed, world_sizes[0]), [], ""
    for g, world_size in enumerate(world_sizes):
        state.set_world_size(world_size)
        last = g == len(world_sizes) - 1
        copies = []
        for rank in range(world_size):  # every rank starts from the same restored state, as after a restart
            mine = ReaderState.from_state_dict(state.state_dict())
            a = mine.assignment(units, rank)
            take = np.arange(len(a)) if last else np.random.default_rng([g, rank]).permutation(len(a))
            take = take[: len(a) if last else int(len(a) * fraction)]
            seen += list(zip(a.unit[take].tolist(), a.within[take].tolist(), strict=True))
            mine.mark(rank, a.offset[take].tolist())
            copies.append(mine)
        saved = json.dumps(ReaderState.merge(copies).state_dict())
        state = ReaderState.from_state_dict(json.loads(saved))
    return seen, saved


def _check_once(units: Units, seen: list[tuple[int, int]]) -> None:
    expected = {(u, i) for u, n in enumerate(units.sizes.tolist()) for i in range(n)}
    assert len(seen) == len(set(seen)), "a sample was delivered twice"
    assert set(seen) == expected


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 120),
    world_sizes=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    fraction=st.floats(0, 1),
)
def test_ids_any_stop_any_world_size_reads_the_rest_once(n: int, world_sizes: list[int], fraction: float) -> None:
    units = Units.of_ids([f"id-{i}" for i in range(n)])
    _check_once(units, _epoch(units, world_sizes, fraction)[0])


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 20), min_size=1, max_size=12),
    world_sizes=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    fraction=st.floats(0, 1),
)
def test_shards_any_stop_any_world_size_reads_the_rest_once(
    sizes: list[int], world_sizes: list[int], fraction: float
) -> None:
    units = Units.of_shards([f"train-{i:06d}.tar" for i in range(len(sizes))], sizes)
    _check_once(units, _epoch(units, world_sizes, fraction)[0])


def test_order_depends_on_seed_and_epoch_not_on_world_size() -> None:
    units = Units.of_ids([f"id-{i}" for i in range(50)])

    def order(world_size: int, seed: int = 1, epoch: int = 0) -> list[int]:
        state = ReaderState(seed, world_size, epoch)
        return [u for r in range(world_size) for u in state.assignment(units, r).unit.tolist()]

    assert order(1) == order(2) == order(7)
    assert order(1) != order(1, epoch=1)
    assert order(1) != order(1, seed=2)
    from imgest.readback.cassandra import CassandraReadOptions, epoch_order

    old = epoch_order([f"id-{i}" for i in range(50)], np.zeros(50), CassandraReadOptions(seed=1), 0)
    assert order(1) == old.tolist()  # the same epoch order as CassandraReader's own


def test_shard_parts_are_whole_shards_and_workers_disjoint() -> None:
    units = Units.of_shards([f"s{i}" for i in range(9)], [16] * 8 + [5])
    state = ReaderState(0, 2)
    for rank in range(2):
        whole = state.assignment(units, rank)
        runs = whole.runs()
        assert all(len(w) == units.sizes[u] for u, w, _ in runs)  # nothing read yet: every shard whole
        parts = [state.assignment(units, rank, w, 2).offset.tolist() for w in range(2)]
        assert sorted(parts[0] + parts[1]) == whole.offset.tolist()
        assert not set(parts[0]) & set(parts[1])


def test_state_is_small_json_and_refuses_other_data() -> None:
    units = Units.of_ids([f"id-{i}" for i in range(10_000)])
    _, saved = _epoch(units, [4, 3], 0.4)
    doc = json.loads(saved)
    assert doc["format"] == "imgest-reader-state"
    assert doc["world_size"] == 3
    state = ReaderState.from_state_dict(doc)
    assert state.delivered() == sum(doc["samples_done"]) + sum(
        r["done"] + sum(b - a for a, b in r["ahead"]) for g in doc["history"] for r in g["ranks"]
    )
    with pytest.raises(ResumeError, match="another dataset"):
        state.assignment(Units.of_ids([f"other-{i}" for i in range(10_000)]), 0)
    fresh = ReaderState(0, 1)
    first = int(fresh.assignment(units, 0).offset[0])
    with pytest.raises(ResumeError, match="twice"):
        fresh.mark(0, [first, first])
    with pytest.raises(ResumeError, match="same step"):
        ReaderState.merge([ReaderState(0, 2, epoch=1), ReaderState(0, 2, epoch=2)])


def test_set_epoch_starts_fresh_and_keeps_a_restored_epoch() -> None:
    units = Units.of_ids([f"id-{i}" for i in range(20)])
    state = ReaderState(0, 1, epoch=4)
    state.mark(0, state.assignment(units, 0).offset[:5].tolist())
    state.set_epoch(4)
    assert state.delivered() == 5
    state.set_epoch(5)
    assert state.delivered() == 0
    assert len(state.assignment(units, 0)) == 20


def test_torch_workers_and_ranks_resume_without_services(tmp_path: Path) -> None:
    """The quick tier's check of the DataLoader path: 2 workers per rank, 2 ranks stop early, 3 ranks finish."""
    pytest.importorskip("torch", reason="imgest[torch] is part of the dev install (requirements/torch.txt)")
    from torch.utils.data import DataLoader

    from imgest.readback.torchdata import FilesDataset, collate, tracked

    ids = [f"id-{i}" for i in range(23)]
    paths = []
    for i in ids:
        (tmp_path / i).write_bytes(i.encode() * 3)
        paths.append(str(tmp_path / i))
    seen: Counter[str] = Counter()

    def read(state: ReaderState, rank: int, stop: int | None) -> None:
        dataset = FilesDataset(paths, range(23), ids, state, rank)
        loader = DataLoader(dataset, batch_size=2, num_workers=2, collate_fn=collate)
        for batch in tracked(loader, state, rank):
            for image, key in zip(batch["images"], batch["ids"], strict=True):
                assert image.numpy().tobytes() == key.encode() * 3
                seen[key] += 1
            if stop is not None and sum(state.samples_done()) >= stop:
                break

    states = [ReaderState(1, 2), ReaderState(1, 2)]
    for rank, state in enumerate(states):
        read(state, rank, stop=4)
    restored = ReaderState.from_state_dict(json.loads(json.dumps(ReaderState.merge(states).state_dict())))
    assert restored.delivered() == sum(seen.values()) == 8
    restored.set_world_size(3)
    for rank in range(3):
        read(ReaderState.from_state_dict(restored.state_dict()), rank, stop=None)
    assert sorted(seen) == sorted(ids)
    assert set(seen.values()) == {1}
