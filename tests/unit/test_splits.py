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
from imgest.splits.split import (
    SplitFile,
    balanced_counts,
    class_weights,
    cut,
    id_strings,
    load_split,
    make_split,
    parse_ratios,
)

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


def _members_before(labels: np.ndarray, num_classes: int) -> list[np.ndarray]:
    """How make_split grouped rows before it sorted once: one full comparison per class."""
    return [np.flatnonzero(labels == c) for c in range(num_classes)]


@given(labels=st.lists(st.integers(-1, 8), min_size=0, max_size=300), seed=st.integers(0, 5))
@settings(max_examples=200, deadline=None)
def test_split_by_sorting_once_equals_one_pass_per_class(labels: list[int], seed: int) -> None:
    arr = np.asarray(labels, dtype=np.int32)
    classes = 7  # labels -1, 7 and 8 lie outside: never used, as before
    parts = make_split(arr, [3, 1], "original", seed, classes)
    members = _members_before(arr, classes)
    want: list[list[np.ndarray]] = [[], []]
    for c, rows in enumerate(members):
        shuffled = np.random.default_rng([seed, c]).permutation(rows)
        first = cut(len(rows), [3, 1])[0]
        want[0].append(shuffled[:first])
        want[1].append(shuffled[first:])
    for got, expect in zip(parts, want, strict=True):
        assert np.array_equal(got, np.sort(np.concatenate(expect)) if expect else np.zeros(0, dtype=np.int64))


def test_uuid_bytes_format_as_their_strings_and_sort_alike() -> None:
    from imgest.splits.split import id_strings

    ids = [uuid.UUID(int=0), uuid.UUID(bytes=b"\x00" * 15 + b"\x01"), *(uuid.uuid4() for _ in range(70_000))]
    raw = np.frombuffer(b"".join(u.bytes for u in ids), dtype="S16")
    assert id_strings(raw).tolist() == [str(u) for u in ids]
    assert id_strings(raw[np.argsort(raw)]).tolist() == sorted(str(u) for u in ids)
    strings = np.array(["b", "a"])
    assert id_strings(strings) is strings  # ids that are not 16-byte UUIDs are left as they are


def test_split_of_uuid_bytes_writes_the_same_files_as_strings(tmp_path: Path) -> None:
    ids = sorted(uuid.uuid5(uuid.NAMESPACE_OID, str(n)).bytes for n in range(50))
    raw = np.frombuffer(b"".join(ids), dtype="S16")
    labels = np.arange(50) % 3
    as_bytes = SplitFile(raw, labels, make_split(labels, [8, 2], "original", 1), 3, {"kind": "cassandra"})
    strings = np.array([str(uuid.UUID(bytes=b)) for b in ids])
    as_text = SplitFile(strings, labels, as_bytes.parts, 3, {"kind": "cassandra"})
    for split, name in ((as_bytes, "b"), (as_text, "t")):
        split.save(tmp_path / f"{name}.npz")
        split.save_crs4(tmp_path / f"{name}.pckl")
    assert np.array_equal(load_split(tmp_path / "b.npz").row_ids, load_split(tmp_path / "t.npz").row_ids)
    assert np.array_equal(as_bytes.part(0)[0], as_text.part(0)[0])
    crs4 = [pickle.loads((tmp_path / f"{n}.pckl").read_bytes())["row_keys"].tolist() for n in ("b", "t")]
    assert crs4[0] == crs4[1] == [uuid.UUID(bytes=b) for b in ids]
    LabelledRows(raw, labels, 3, {"kind": "cassandra"}).save(tmp_path / "meta.parquet")
    cached = LabelledRows.load(tmp_path / "meta.parquet").ids  # the cache keeps the 16 bytes (issue #41)
    assert cached.dtype == np.dtype("S16")
    assert id_strings(cached).tolist() == strings.tolist()


def test_uuid_strings_become_sorted_16_byte_ids_without_python_objects() -> None:
    import pyarrow as pa

    from imgest.core.errors import ImgestError
    from imgest.splits.sources import uuid_bytes
    from imgest.splits.split import id_strings

    ids = [str(uuid.uuid5(uuid.NAMESPACE_OID, f"s-{n}")) for n in range(2000)]
    chunks = pa.chunked_array([pa.array(ids[:700]), pa.array([i.upper() for i in ids[700:]])])
    raw = uuid_bytes(chunks)
    assert raw.dtype == np.dtype("S16")
    assert list(id_strings(raw)) == ids  # upper-case input comes back as the canonical lowercase string
    assert np.array_equal(np.argsort(raw, kind="stable"), np.argsort(np.array(ids), kind="stable"))
    assert list(id_strings(uuid_bytes(pa.array(ids).slice(5, 3)))) == ids[5:8]  # a slice's offset is honoured
    assert len(uuid_bytes(pa.array([], pa.string()))) == 0
    with pytest.raises(ImgestError, match="UUID strings"):
        uuid_bytes(pa.array(["not-a-uuid"]))
