"""Split arithmetic (property tests), the safe file format, the metadata cache and the crs4 export."""

from __future__ import annotations

import pickle
import uuid
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imgest.core.errors import ConfigError
from imgest.splits.sources import LabelledRows
from imgest.splits.split import SplitFile, balanced_counts, class_weights, cut, load_split, make_split, parse_ratios

ratios_st = st.lists(st.integers(1, 10), min_size=1, max_size=5)
labels_st = st.lists(st.integers(0, 6), min_size=1, max_size=300)


@given(n=st.integers(0, 5000), ratios=ratios_st)
def test_cut_uses_every_item_and_follows_the_ratios(n: int, ratios: list[int]) -> None:
    sizes = cut(n, ratios)
    assert sum(sizes) == n
    total = sum(ratios)
    for size, r in zip(sizes, ratios, strict=True):
        assert abs(size - n * r / total) < 1  # largest remainder: off by less than one


@given(labels=labels_st, ratios=ratios_st, seed=st.integers(0, 10))
@settings(max_examples=200, deadline=None)
def test_original_balance_uses_every_row_once(labels: list[int], ratios: list[int], seed: int) -> None:
    arr = np.asarray(labels)
    parts = make_split(arr, ratios, "original", seed)
    joined = np.concatenate(parts)
    assert len(joined) == len(set(joined.tolist())) == len(arr)  # disjoint and complete
    again = make_split(arr, ratios, "original", seed)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    for c in set(labels):  # each class is cut by the ratios on its own
        n = int((arr == c).sum())
        assert [int((arr[p] == c).sum()) for p in parts] == cut(n, ratios)


@given(counts=st.lists(st.integers(1, 60), min_size=2, max_size=6), data=st.data())
@settings(max_examples=200, deadline=None)
def test_weights_fully_use_the_most_constrained_class(counts: list[int], data: st.DataObject) -> None:
    weights = np.asarray(data.draw(st.lists(st.integers(1, 9), min_size=len(counts), max_size=len(counts))), float)
    use = balanced_counts(counts, weights)
    ratio = np.asarray(counts) / weights
    tightest = int(np.argmin(ratio))
    assert use[tightest] == counts[tightest]
    assert np.all(use <= np.asarray(counts))
    # maximal: no class could take one more image without exceeding the tightest class's share
    scale = ratio[tightest]
    assert np.all((use + 1) / weights > scale - 1e-9)


@pytest.mark.parametrize(
    ("counts", "weights", "expected"),
    [
        ([10, 4, 6], [1, 1, 1], [4, 4, 4]),  # uniform: every class cut to the smallest
        ([10, 4, 6], [2, 1, 1], [8, 4, 4]),  # class 0 weighs twice: 8 of its 10
        ([3, 50, 9], [1, 10, 2], [3, 30, 6]),  # class 0 is the tightest (3 / 1)
        ([7, 7], [3, 2], [7, 4]),  # 7 / 3 = 2.33 per weight unit: 4.67 -> 4
    ],
)
def test_balanced_counts_worked_examples(counts: list[int], weights: list[int], expected: list[int]) -> None:
    assert balanced_counts(counts, np.asarray(weights, float)).tolist() == expected


def test_one_image_classes_and_uneven_ratios() -> None:
    labels = np.array([0, 1, 1, 2, 2, 2, 2, 2, 2, 2])  # class 0 has a single image
    parts = make_split(labels, [8, 2], "original", seed=3)
    assert [len(p) for p in parts] == [1 + 2 + 6, 0 + 0 + 1]
    parts = make_split(labels, [1, 1, 1], "original", seed=3)
    assert sorted(np.concatenate(parts).tolist()) == list(range(10))
    assert [len(p) for p in parts] == [1 + 1 + 3, 0 + 1 + 2, 0 + 0 + 2]


def test_equal_weights_cap_every_class_at_the_smallest() -> None:
    labels = np.repeat([0, 1, 2], [5, 20, 40])
    parts = make_split(labels, [4, 1], "1,1,1", seed=0)
    per_class = np.bincount(labels[np.concatenate(parts)], minlength=3)
    assert per_class.tolist() == [5, 5, 5]


def test_seed_changes_membership_not_sizes() -> None:
    labels = np.repeat(np.arange(4), 25)
    a, b = make_split(labels, [8, 2], "original", 1), make_split(labels, [8, 2], "original", 2)
    assert [len(p) for p in a] == [len(p) for p in b]
    assert not np.array_equal(a[1], b[1])


def test_random_balance_is_seeded() -> None:
    counts = [10, 20, 30]
    assert np.array_equal(class_weights("random", counts, 5), class_weights("random", counts, 5))
    assert not np.array_equal(class_weights("random", counts, 5), class_weights("random", counts, 6))


@pytest.mark.parametrize(
    ("balance", "ratios"), [("1,2", "8,2"), ("original", "8,-2"), ("x", "8,2"), ("original", "a,b"), ("0,0,0", "1")]
)
def test_bad_inputs_are_config_errors(balance: str, ratios: str) -> None:
    with pytest.raises(ConfigError):
        make_split(np.array([0, 1, 2]), parse_ratios(ratios), balance, 0, 3)


def _split() -> SplitFile:
    ids = np.array(sorted(str(uuid.uuid5(uuid.NAMESPACE_OID, str(i))) for i in range(50)))
    labels = np.arange(50) % 5
    parts = make_split(labels, [7, 2, 1], "original", 4)
    source = {"kind": "cassandra", "data_table": "inet.data", "metadata_table": "inet.metadata"}
    return SplitFile(ids, labels, parts, 5, source, {"ratios": [7, 2, 1]})


def test_safe_file_round_trip_without_pickle(tmp_path: Path) -> None:
    split = _split()
    split.save(tmp_path / "s.npz")
    loaded = load_split(tmp_path / "s.npz")
    assert loaded.num_classes == 5
    assert loaded.source == split.source
    assert np.array_equal(loaded.row_ids, split.row_ids)
    for k in range(3):
        ids, labels = loaded.part(k)
        assert np.array_equal(ids, split.row_ids[split.parts[k]])
        assert np.array_equal(labels, split.labels[split.parts[k]])
    with np.load(tmp_path / "s.npz", allow_pickle=False) as raw:  # plain arrays only
        assert {raw[k].dtype.kind for k in raw.files} <= {"U", "i"}


def test_crs4_export_loads_with_plain_pickle(tmp_path: Path) -> None:
    split = _split()
    split.save_crs4(tmp_path / "s.pckl")
    with open(tmp_path / "s.pckl", "rb") as fh:
        d = pickle.load(fh)
    assert set(d) == {
        "data_table",
        "data_id_col",
        "data_label_col",
        "metadata_table",
        "medadata_id_col",
        "metadata_label_col",
        "data_col",
        "label_type",
        "row_keys",
        "split",
        "num_classes",
    }
    assert (d["data_table"], d["metadata_table"]) == ("inet.data", "inet.metadata")
    assert (d["data_id_col"], d["data_label_col"], d["data_col"], d["label_type"]) == ("id", "label", "data", "int")
    assert isinstance(d["row_keys"], np.ndarray)
    assert all(isinstance(k, uuid.UUID) for k in d["row_keys"])
    assert isinstance(d["split"], list)
    assert len(d["split"]) == 3
    assert all(isinstance(p, np.ndarray) and p.dtype.kind == "i" for p in d["split"])
    assert d["num_classes"] == 5
    assert str(d["row_keys"][d["split"][1][0]]) == split.row_ids[split.parts[1][0]]


def test_metadata_cache_round_trip(tmp_path: Path) -> None:
    rows = LabelledRows(np.array(["b", "a"]), np.array([1, 0]), 7, {"kind": "shards", "location": "/x"})
    rows.save(tmp_path / "meta.parquet")
    back = LabelledRows.load(tmp_path / "meta.parquet")
    assert back.ids.tolist() == ["b", "a"]
    assert back.labels.tolist() == [1, 0]
    assert back.num_classes == 7
    assert back.source == {"kind": "shards", "location": "/x"}
