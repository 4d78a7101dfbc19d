"""The streamed crs4 export writes exactly what pickle.dump of the plain dictionary writes."""

from __future__ import annotations

import pickle
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from imgest.core.errors import ConfigError
from imgest.splits.crs4 import ID_CHUNK, write_crs4
from imgest.splits.sources import LabelledRows
from imgest.splits.split import id_strings, make_split, write_split_files

SOURCE = {"kind": "cassandra", "data_table": "imgest.data_train", "metadata_table": "imgest.metadata_train"}


def plain_pickle(ids: np.ndarray, parts: list[np.ndarray], num_classes: int, source: dict[str, Any]) -> bytes:
    """The export as it was written before streaming: one uuid.UUID per row, one pickle.dumps."""
    return pickle.dumps(
        {
            "data_table": source.get("data_table", ""),
            "data_id_col": "id",
            "data_label_col": "label",
            "metadata_table": source.get("metadata_table", ""),
            "medadata_id_col": "id",
            "metadata_label_col": "label",
            "data_col": "data",
            "label_type": "int",
            "row_keys": np.array([uuid.UUID(r) for r in id_strings(ids)], dtype=object),
            "split": [p.astype(np.int64) for p in parts],
            "num_classes": num_classes,
        }
    )


def random_ids(n: int, seed: int) -> np.ndarray:
    """N 16-byte ids, with the extremes of the integer encoding (0, a small int, all ones) up front."""
    raw = bytearray(np.random.default_rng(seed).bytes(16 * n))
    for i, special in enumerate([b"\0" * 16, b"\0" * 15 + b"\x07", b"\0" * 12 + b"\x7f\xff\xff\xff", b"\xff" * 16]):
        if i < n:
            raw[16 * i : 16 * i + 16] = special
    return np.frombuffer(bytes(raw), dtype="S16")


@pytest.mark.parametrize("n", [0, 1, 2, 5, 999, 1000, 1001, 1002, 2001, 5000, 2 * ID_CHUNK + 1001])
@pytest.mark.parametrize("ratios", [[1], [8, 2], [5, 3, 2]])
def test_stream_is_byte_for_byte_the_plain_pickle(tmp_path: Path, n: int, ratios: list[int]) -> None:
    ids = random_ids(n, seed=n)
    labels = np.random.default_rng(n).integers(0, 7, n)
    parts = make_split(labels, ratios, "original", 3, 7)
    write_crs4(tmp_path / "s.pckl", ids, parts, 7, SOURCE)
    written = (tmp_path / "s.pckl").read_bytes()
    assert written == plain_pickle(ids, parts, 7, SOURCE)
    loaded = pickle.loads(written)
    assert loaded["row_keys"].tolist() == [uuid.UUID(bytes=ids[i : i + 1].tobytes()) for i in range(n)]
    assert [p.tolist() for p in loaded["split"]] == [p.tolist() for p in parts]
    assert not list(tmp_path.glob("*.tmp"))


def test_one_class_string_ids_and_many_parts_match(tmp_path: Path) -> None:
    ids = id_strings(random_ids(1500, seed=9))  # ids as UUID strings, as a metadata cache gives them
    parts = [np.arange(k, 1500, 1001) for k in range(1001)]  # a list of 1001 arrays: the last batch holds one
    for source in (SOURCE, {}):
        write_crs4(tmp_path / "s.pckl", ids, parts, 1, source)
        assert (tmp_path / "s.pckl").read_bytes() == plain_pickle(ids, parts, 1, source)


def test_split_files_write_the_plain_pickle(tmp_path: Path) -> None:
    ids = random_ids(3000, seed=4)
    rows = LabelledRows(ids, np.zeros(3000, dtype=np.int32), 1, SOURCE)  # one class
    split = write_split_files(rows, [8, 2], "original", 0, tmp_path / "split.npz", crs4=True)
    assert (tmp_path / "split.pckl").read_bytes() == plain_pickle(ids, split.parts, 1, SOURCE)


def test_ids_that_are_not_uuids_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"not a UUID.*npz split only"):
        write_crs4(tmp_path / "s.pckl", np.array(["n01440764_10026"]), [np.arange(1)], 1, SOURCE)
    assert not list(tmp_path.iterdir())  # nothing half-written is left
