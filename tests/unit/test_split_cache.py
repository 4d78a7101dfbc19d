"""The split metadata cache (--metadata-ofn / --metadata-ifn) keeps ids as 16-byte UUIDs (issue #41): on disk as
``fixed_size_binary(16)``, in memory as 'S16', never one Python string per id; a cache of UUID strings (as imgest
wrote it before) loads as the same 16 bytes, and a split from any of them writes the .npz, byte for byte, that the
rows it came from write. Ids that are not canonical UUID strings come back exactly as they were."""

from __future__ import annotations

import tracemalloc
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from imgest.splits import sources
from imgest.splits.sources import LabelledRows
from imgest.splits.split import id_strings, write_split_files

SOURCE = {"kind": "cassandra", "data_table": "ks.data", "metadata_table": "ks.metadata"}


def _rows(n: int, seed: int = 0) -> LabelledRows:
    rng = np.random.default_rng(seed)
    ids = np.sort(np.frombuffer(rng.bytes(16 * n), dtype="S16"))
    return LabelledRows(ids, rng.integers(0, 7, n).astype(np.int32), 7, SOURCE)


def _old_cache(rows: LabelledRows, path: Path) -> None:
    """A cache as imgest wrote it before: the ids as UUID strings."""
    strings = [str(uuid.UUID(bytes=bytes(b).ljust(16, b"\0"))) for b in rows.ids.tolist()]
    table = pa.table({"id": pa.array(strings, pa.string()), "label": rows.labels})
    meta = {b"imgest_source": b'{"kind": "cassandra", "data_table": "ks.data", "metadata_table": "ks.metadata"}'}
    pq.write_table(table.replace_schema_metadata({**meta, b"num_classes": b"7"}), path)


def test_cache_holds_16_byte_ids_and_splits_as_the_rows_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources, "UUID_CHUNK", 999)  # many chunks
    rows = _rows(5000)
    rows.save(tmp_path / "new.parquet")
    assert pq.read_schema(tmp_path / "new.parquet").field("id").type == pa.binary(16)
    _old_cache(rows, tmp_path / "old.parquet")
    write_split_files(rows, [8, 2], "original", 3, tmp_path / "rows.npz")
    for name in ("new", "old"):
        back = LabelledRows.load(tmp_path / f"{name}.parquet")
        assert back.ids.dtype == np.dtype("S16")
        assert np.array_equal(back.ids, rows.ids)
        assert np.array_equal(back.labels, rows.labels)
        assert (back.num_classes, back.source) == (7, SOURCE)
        write_split_files(back, [8, 2], "original", 3, tmp_path / f"{name}.npz")
        assert (tmp_path / f"{name}.npz").read_bytes() == (tmp_path / "rows.npz").read_bytes()


@pytest.mark.parametrize(
    "ids",
    [
        ["b", "a"],
        [str(uuid.uuid5(uuid.NAMESPACE_OID, "x")).upper(), str(uuid.uuid5(uuid.NAMESPACE_OID, "y"))],
        ["0123456789abcdef0123456789abcdef-abc", str(uuid.uuid5(uuid.NAMESPACE_OID, "z"))],  # dashes elsewhere
        ["g" * 8 + "-0000-0000-0000-" + "0" * 12],  # not hexadecimal
        ["é" * 36],
    ],
)
def test_ids_that_are_not_canonical_uuids_come_back_as_they_were(tmp_path: Path, ids: list[str]) -> None:
    LabelledRows(np.array(ids), np.arange(len(ids)), 2, {}).save(tmp_path / "c.parquet")
    back = LabelledRows.load(tmp_path / "c.parquet")
    assert back.ids.tolist() == ids


def test_cache_load_holds_no_string_per_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """200,000 ids: the load's numpy and Python allocations stay near the 16-byte output plus a chunk's temporaries
    (UUID strings as Python objects and a '<U36' column, as before, were over 200 bytes a row)."""
    monkeypatch.setattr(sources, "UUID_CHUNK", 4096)
    rows = _rows(200_000, seed=1)
    _old_cache(rows, tmp_path / "old.parquet")
    rows.save(tmp_path / "new.parquet")
    for name in ("old", "new"):
        tracemalloc.start()
        back = LabelledRows.load(tmp_path / f"{name}.parquet")
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert np.array_equal(back.ids, rows.ids)
        assert peak < 40 * len(rows.ids), f"{name}: {peak / len(rows.ids):.0f} bytes a row"
    assert id_strings(back.ids[:3]).tolist() == [str(uuid.UUID(bytes=bytes(b))) for b in rows.ids[:3].tolist()]
