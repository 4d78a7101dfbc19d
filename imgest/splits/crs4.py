"""The crs4 split export: the pickled dictionary cassandra-dali-plugin's training scripts load, written as a stream.

``pickle.dump`` of that dictionary needs one ``uuid.UUID`` per row plus, in the pickler's memo, every UUID
and its state dictionary until the dump ends: about 450 bytes a row, 600 MB at ImageNet's 1.33 M rows.
:func:`write_crs4` writes the same bytes (same opcodes, memo numbering and 64 KiB frames as the C pickler of
``pickle.dump`` at the default protocol) while holding one chunk of ids at a time: the UUIDs are emitted
straight from the 16-byte ids and never kept.

It drives the pure-Python pickler (``pickle._Pickler``), which writes what the C pickler writes except for
the last batch of a list (C writes a lone last item of a long list as ``MARK item APPENDS``); that case is
matched here. The unit tests compare the bytes with ``pickle.dumps`` of the dictionary built the plain way.
"""

from __future__ import annotations

import os
import pickle
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from imgest.core.errors import ConfigError

ID_CHUNK = 1 << 13  # rows turned into Python ints at a time (a few hundred KB)
_BATCH = 1000  # the pickler's APPENDS batch (pickle._Pickler._BATCHSIZE, BATCHSIZE in _pickle.c)


class _RowKeys:
    """Stands in the dictionary for the object array of uuid.UUID that the plain export builds."""

    def __init__(self, ids: np.ndarray) -> None:
        self.ids = ids


class _UuidList:
    """Stands for that array's item list (numpy pickles an object array's items as a plain list)."""

    def __init__(self, ids: np.ndarray) -> None:
        self.ids = ids


def uuid_ints(ids: np.ndarray, chunk: int = ID_CHUNK) -> Iterator[list[int]]:
    """The 128-bit integers of IDS (16-byte UUIDs 'S16', or UUID strings), a list per CHUNK of rows."""
    ids = np.asarray(ids)
    for start in range(0, len(ids), chunk):
        part = ids[start : start + chunk]
        if part.dtype == np.dtype("S16"):
            halves = np.ascontiguousarray(part).view(">u8").reshape(-1, 2).tolist()
            yield [(hi << 64) | lo for hi, lo in halves]
            continue
        try:
            yield [uuid.UUID(str(r)).int for r in part]
        except ValueError as err:
            raise ConfigError(
                f"row ids {start}..{start + len(part) - 1} hold a value that is not a UUID ({err}); the crs4 split "
                "format is for Cassandra rows (uuid ids): write the .npz split only"
            ) from None


class _Crs4Pickler(pickle._Pickler):  # the pure-Python pickler: its save steps can be overridden
    """A pickler whose memo does not keep the row UUIDs, with the row keys streamed from the id column."""

    dispatch = pickle._Pickler.dispatch.copy()

    def __init__(self, file: Any, protocol: int) -> None:
        super().__init__(file, protocol)
        self._memo_next = 0  # the memo index the next MEMOIZE gets (the memo itself skips the row UUIDs)

    def memoize(self, obj: Any) -> None:
        """Record OBJ in the memo under the next index (pickle numbers entries by len(memo))."""
        self.write(self.put(self._memo_next))
        self.memo[id(obj)] = self._memo_next, obj
        self._memo_next += 1

    def _batch_appends(self, items: Any, obj: Any = None) -> None:
        """A list's items as the C pickler writes them: APPEND only for a list of one item."""
        if type(items) is not list or len(items) <= 1:
            super()._batch_appends(items, *(() if obj is None else (obj,)))
            return
        for start in range(0, len(items), _BATCH):
            self.write(pickle.MARK)
            for item in items[start : start + _BATCH]:
                self.save(item)
            self.write(pickle.APPENDS)

    def save_row_keys(self, obj: _RowKeys) -> None:
        """The object array as numpy reduces it: _reconstruct, then BUILD with (1, shape, dtype, fortran, items)."""
        func, args, (version, _shape, dtype, fortran, _items) = np.empty(0, dtype=object).__reduce_ex__(self.proto)
        self.save_reduce(func, args, (version, (len(obj.ids),), dtype, fortran, _UuidList(obj.ids)), obj=obj)

    def save_uuid_list(self, obj: _UuidList) -> None:
        """EMPTY_LIST, then the UUIDs in batches, each emitted as pickle would emit a fresh uuid.UUID."""
        self.write(pickle.EMPTY_LIST)
        self.memoize(obj)
        total = len(obj.ids)
        if total == 0:
            return
        ints = (v for chunk in uuid_ints(obj.ids) for v in chunk)
        first = next(ints)
        if total == 1:
            self.save(uuid.UUID(int=first))
            self.write(pickle.APPEND)
            return
        self.write(pickle.MARK)
        self.save(uuid.UUID(int=first))  # the general path memoizes the class and the state key ...
        cls_get = self.get(self.memo[id(uuid.UUID)][0])
        key = next(iter(uuid.UUID(int=first).__getstate__()))
        key_get = self.get(self.memo[id(key)][0])  # ... which the rest fetch with BINGET, as pickle does
        in_batch = 1
        for value in ints:
            if in_batch == _BATCH:
                self.write(pickle.APPENDS + pickle.MARK)
                in_batch = 0
            self._save_uuid(value, cls_get, key_get)
            in_batch += 1
        self.write(pickle.APPENDS)

    def _save_uuid(self, value: int, cls_get: bytes, key_get: bytes) -> None:
        """What save(uuid.UUID(int=VALUE)) writes after the first: NEWOBJ of the class, BUILD with {'int': VALUE}.

        A frame may end where any save() starts, so commit_frame is called at each of those points."""
        commit, write = self.framer.commit_frame, self.write
        commit()  # save(the UUID)
        commit()  # save(its class): memo hit
        write(cls_get)
        commit()  # save(()): not memoized
        write(pickle.EMPTY_TUPLE + pickle.NEWOBJ + pickle.MEMOIZE)
        commit()  # save(the state dict)
        write(pickle.EMPTY_DICT + pickle.MEMOIZE)
        commit()  # save('int'): memo hit
        write(key_get)
        commit()  # save(the int)
        self.save_long(value)
        write(pickle.SETITEM + pickle.BUILD)
        self._memo_next += 2  # the UUID and its state dict take memo indices without being kept

    dispatch[_RowKeys] = save_row_keys
    dispatch[_UuidList] = save_uuid_list


def crs4_dictionary(source: dict[str, Any], row_keys: Any, parts: Sequence[np.ndarray], num_classes: int) -> dict:
    """The dictionary of the crs4 format (the training scripts' key spellings kept, 'medadata_id_col' included)."""
    return {
        "data_table": source.get("data_table", ""),
        "data_id_col": "id",
        "data_label_col": "label",
        "metadata_table": source.get("metadata_table", ""),
        "medadata_id_col": "id",
        "metadata_label_col": "label",
        "data_col": "data",
        "label_type": "int",
        "row_keys": row_keys,
        "split": [p.astype(np.int64, copy=False) for p in parts],
        "num_classes": num_classes,
    }


def write_crs4(
    path: Path, row_ids: np.ndarray, parts: Sequence[np.ndarray], num_classes: int, source: dict[str, Any]
) -> None:
    """Write PATH: the crs4 dictionary with row_keys an object array of uuid.UUID made from ROW_IDS, byte for byte
    what pickle.dump of that dictionary writes, holding a chunk of ids at a time; PATH appears only when complete."""
    tmp = path.with_name(path.name + ".tmp")
    data = crs4_dictionary(source, _RowKeys(np.asarray(row_ids)), parts, num_classes)
    try:
        with open(tmp, "wb") as fh:
            _Crs4Pickler(fh, pickle.DEFAULT_PROTOCOL).dump(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
