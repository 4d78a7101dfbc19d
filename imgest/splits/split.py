"""Train/val split files: ratios, class balancing, a seed, a safe file format and the crs4 export.

Balancing rule: each class gets a weight (``original``: its own count, so every image is used;
``random``: seeded random weights; or one weight per class). Per-class counts are the weights scaled so
that the most constrained class (smallest count / weight) is fully used, rounded down. Each class is
then shuffled with the seed and cut by the ratios with the largest-remainder method, so no image is lost
to rounding: only what the balance itself leaves out is unused.

The default file is a NumPy ``.npz`` read with ``allow_pickle=False``: row ids (UUID strings), labels,
one index array per part, the class count and where the data lives. ``--format crs4`` also writes the
pickled dictionary the cassandra-dali-plugin training scripts load (streamed: imgest.splits.crs4).

Everything works on numpy columns: in memory, ids read from Cassandra, a shard dataset or the metadata cache
stay 16-byte UUIDs ('S16', 16 bytes a row rather than 144 as UUID strings) and become strings only where a file
or a reader needs them.

The .npz's ``row_ids.npy`` stays '<U36' (issue #41 weighed an 'S16' member beside it and kept the file as it
was): training scripts, ``load_split`` and the DALI readers (imgest.readback.api, examples/read_cassandra.py)
read UUID strings from it, and the same split still writes the same bytes. Writing it never builds a Python
string per id nor a whole-length string array: the ids are formatted and compressed ID_CHUNK at a time
(_write_ids). Reading it back (``load_split``) holds the column as '<U36', 144 bytes a row, as before.
"""

from __future__ import annotations

import json
import math
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from imgest.core.errors import ConfigError
from imgest.core.textcols import uuid_text
from imgest.splits.crs4 import write_crs4

FORMAT_VERSION = 1
ID_CHUNK = 1 << 16
ROW_CHUNK = 1 << 16  # rows handled at a time where a whole-length temporary is not needed


def id_strings(ids: np.ndarray) -> np.ndarray:
    """IDS as UUID strings ('U36'): 16-byte UUIDs ('S16') are formatted (vectorized, in chunks); any other
    array of ids is returned as it is."""
    ids = np.asarray(ids)
    if ids.dtype != np.dtype("S16"):
        return ids
    out = np.empty(len(ids), dtype="U36")
    for start in range(0, len(ids), ID_CHUNK):
        chunk = ids[start : start + ID_CHUNK]
        out[start : start + len(chunk)] = uuid_text(chunk).view("S36").ravel().astype("U36")
    return out


def parse_ratios(text: str | Sequence[float]) -> list[float]:
    """'8,2' -> [8.0, 2.0]; every ratio must be positive."""
    try:
        ratios = [float(r) for r in (text.split(",") if isinstance(text, str) else text)]
    except ValueError:
        raise ConfigError(f"split ratios {text!r} must be numbers separated by commas") from None
    if not ratios or any(r <= 0 or not math.isfinite(r) for r in ratios):
        raise ConfigError(f"split ratios {text!r} must all be positive")
    return ratios


def class_weights(balance: str | Sequence[float], counts: Sequence[int], seed: int) -> np.ndarray:
    """Weights per class for BALANCE ('original', 'random', or one weight per class)."""
    if isinstance(balance, str) and balance == "original":
        return np.asarray(counts, dtype=np.float64)
    if isinstance(balance, str) and balance == "random":
        return np.random.default_rng([seed, 77]).random(len(counts)) + 1e-9
    try:
        weights = np.asarray([float(w) for w in (balance.split(",") if isinstance(balance, str) else balance)])
    except ValueError:
        raise ConfigError(f"balance {balance!r}: use original, random, or one number per class") from None
    if len(weights) != len(counts):
        raise ConfigError(f"balance has {len(weights)} weights but the data has {len(counts)} classes")
    if np.any(weights < 0) or not np.any(weights > 0):
        raise ConfigError("balance weights must be non-negative with at least one positive")
    return weights


def balanced_counts(counts: Sequence[int], weights: np.ndarray) -> np.ndarray:
    """Images to use per class: weights scaled so the most constrained class is fully used."""
    counts_arr = np.asarray(counts, dtype=np.float64)
    positive = weights > 0
    scale = float(np.min(counts_arr[positive] / weights[positive]))
    wanted = np.floor(weights * scale + 1e-9)
    return np.minimum(wanted, counts_arr).astype(np.int64)


def cut(n: int, ratios: Sequence[float]) -> list[int]:
    """Sizes of the parts of N items by RATIOS, summing exactly to N (largest remainder, ties to earlier parts)."""
    total = float(sum(ratios))
    exact = [n * r / total for r in ratios]
    sizes = [math.floor(x + 1e-9) for x in exact]
    order = sorted(range(len(ratios)), key=lambda i: (-(exact[i] - sizes[i]), i))
    for i in order[: n - sum(sizes)]:
        sizes[i] += 1
    return sizes


def make_split(
    labels: np.ndarray,
    ratios: Sequence[float],
    balance: str | Sequence[float],
    seed: int,
    num_classes: int | None = None,
) -> list[np.ndarray]:
    """One sorted index array per part into LABELS' rows; parts are disjoint. Besides LABELS and the parts,
    memory is 5 bytes a row (the rows grouped by class as int32, the part of every row as int8) and a chunk."""
    labels = np.asarray(labels)
    num_classes = num_classes or (int(labels.max()) + 1 if len(labels) else 0)
    counts = _class_counts(labels, num_classes)  # rows of other labels are never used
    by_class = _rows_by_class(labels, counts)
    ends = np.cumsum(counts)
    present = [c for c in range(num_classes) if counts[c] > 0]
    weights = class_weights(balance, counts, seed)
    use = np.zeros(num_classes, dtype=np.int64)
    if present:
        use[present] = balanced_counts([counts[c] for c in present], weights[present])
    which = np.full(len(labels), -1, dtype=np.int8 if len(ratios) < 127 else np.int32)
    for c in present:
        members = by_class[int(ends[c]) - counts[c] : int(ends[c])].astype(np.int64)
        shuffled = np.random.default_rng([seed, c]).permutation(members)[: use[c]]
        start = 0
        for p, size in enumerate(cut(int(use[c]), ratios)):
            which[shuffled[start : start + size]] = p
            start += size
    del by_class
    return [np.flatnonzero(which == p) for p in range(len(ratios))]


def _class_counts(labels: np.ndarray, num_classes: int) -> list[int]:
    """Rows per class 0 .. NUM_CLASSES - 1 (labels outside are not counted), a chunk of rows at a time."""
    counts = np.zeros(num_classes, dtype=np.int64)
    for start in range(0, len(labels), ROW_CHUNK):
        chunk = labels[start : start + ROW_CHUNK]
        counts += np.bincount(chunk[(chunk >= 0) & (chunk < num_classes)], minlength=num_classes)
    return counts.tolist()


def _rows_by_class(labels: np.ndarray, counts: Sequence[int]) -> np.ndarray:
    """Indices of the rows of a valid label grouped by class, ascending within a class (a stable counting sort, a
    chunk of rows at a time): int32 when the count allows, no full-length temporary."""
    num_classes = len(counts)
    ends = np.cumsum(np.asarray(counts, dtype=np.int64))
    cursor = ends - np.asarray(counts, dtype=np.int64)
    out = np.empty(int(ends[-1]) if num_classes else 0, dtype=np.int32 if len(labels) < 2**31 else np.int64)
    for start in range(0, len(labels), ROW_CHUNK):
        chunk = labels[start : start + ROW_CHUNK]
        rows = np.flatnonzero((chunk >= 0) & (chunk < num_classes))
        order = np.argsort(chunk[rows], kind="stable")
        rows, chunk = rows[order], chunk[rows][order]
        here = np.bincount(chunk, minlength=num_classes)
        out[cursor[chunk] + np.arange(len(chunk)) - (np.cumsum(here) - here)[chunk]] = rows + start
        cursor += here
    return out


@dataclass
class SplitFile:
    """A split: row ids and labels, the parts, and where the rows live."""

    row_ids: np.ndarray  # 16-byte UUIDs ('S16') as every source gives them, or strings (load_split: 'U36')
    labels: np.ndarray
    parts: list[np.ndarray]
    num_classes: int
    source: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def part(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids, labels) of part K, for feeding a reader (Cassandra ids or shard sample keys)."""
        idx = self.parts[k]
        return id_strings(self.row_ids[idx]), self.labels[idx]

    def summary(self) -> dict[str, Any]:
        per_part = [np.bincount(self.labels[p], minlength=self.num_classes).tolist() for p in self.parts]
        return {
            "rows": len(self.row_ids),
            "parts": [len(p) for p in self.parts],
            "per_class": per_part,
            "unused": len(self.row_ids) - sum(len(p) for p in self.parts),
        }

    def save(self, path: Path) -> None:
        """The safe format: .npz of plain arrays (load with allow_pickle=False)."""
        meta = {
            "version": FORMAT_VERSION,
            "num_classes": self.num_classes,
            "parts": len(self.parts),
            "source": self.source,
            "settings": self.settings,
        }
        arrays = {
            "labels": self.labels.astype(np.int32, copy=False),
            "meta": np.array(json.dumps(meta, sort_keys=True)),
            **{f"part_{k}": p.astype(np.int64, copy=False) for k, p in enumerate(self.parts)},
        }
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, allowZip64=True) as zf:
            _write_ids(zf, self.row_ids)
            for name, array in arrays.items():
                with zf.open(f"{name}.npy", "w", force_zip64=True) as fh:
                    np.lib.format.write_array(fh, array, allow_pickle=False)

    def save_crs4(self, path: Path) -> None:
        """The dictionary cassandra-dali-plugin's training scripts load (their key spellings kept), streamed a chunk
        of ids at a time: the same bytes as pickle.dump of it (see imgest.splits.crs4)."""
        write_crs4(path, self.row_ids, self.parts, self.num_classes, self.source)


def _write_ids(zf: zipfile.ZipFile, ids: np.ndarray) -> None:
    """IDS as the .npz member row_ids.npy ('U36'), formatted and compressed a chunk at a time (flat memory)."""
    ids, dtype = np.asarray(ids), np.dtype("<U36")
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (len(ids),)}
    with zf.open("row_ids.npy", "w", force_zip64=True) as fh:
        np.lib.format.write_array_header_1_0(fh, header)
        for start in range(0, len(ids), ID_CHUNK):
            fh.write(id_strings(ids[start : start + ID_CHUNK]).astype(dtype).tobytes())


def load_split(path: Path) -> SplitFile:
    """Read a split written by SplitFile.save (never unpickles anything)."""
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data["meta"]))
        if meta.get("version") != FORMAT_VERSION:
            raise ConfigError(f"{path}: split format version {meta.get('version')} is not {FORMAT_VERSION}")
        parts = [data[f"part_{k}"] for k in range(meta["parts"])]
        return SplitFile(data["row_ids"], data["labels"], parts, meta["num_classes"], meta["source"], meta["settings"])


def write_split_files(
    rows: Any,
    ratios: Sequence[float],
    balance: str | Sequence[float],
    seed: int,
    out: Path,
    crs4: bool = False,
    settings: dict[str, Any] | None = None,
) -> SplitFile:
    """Split ROWS (a LabelledRows) and write OUT (.npz), plus OUT with .pckl when CRS4; returns the split."""
    parts = make_split(rows.labels, ratios, balance, seed, rows.num_classes)
    split = SplitFile(
        rows.ids,
        rows.labels,
        parts,
        rows.num_classes,
        rows.source,
        {"ratios": list(ratios), "balance": balance, "seed": seed, **(settings or {})},
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    split.save(out)
    if crs4:
        split.save_crs4(out.with_suffix(".pckl"))
    return split
