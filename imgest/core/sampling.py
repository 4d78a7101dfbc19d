"""What a check reads (read-back, xNVMe): a bounded, seeded, class-balanced sample of one split, chosen from a stream.

Rows arrive in chunks of columns (``Columns``: ids as fixed-width bytes, labels int32, sha256 as an (n, 32)
uint8 array, and whatever else a target needs). Each row gets a key, a seeded 64-bit hash of its id, so the
choice depends on the ids and the seed only (not on the order a scan returns them, and a refresh that changes
few rows changes few picks). Per class the rows with the smallest keys are kept, as many as the class's quota:
the quotas are as equal as the classes allow (a class with fewer rows gives the rest to the others), summing
to the requested size. ``BalancedSample`` keeps at most about ``size + classes`` candidate rows between
chunks whatever the split's size, because the quotas only shrink as more rows arrive.

A size of 0 (or one at least the split's size) is a full read: every row, in stream order.

Shards are read whole, so ``pick_shards`` chooses a seeded subset of whole shards covering about ``size``
samples (the packer shuffles each split before cutting shards, so classes mix) and every sample in them is
checked; ``balance`` states how balanced the result is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Columns = dict[str, np.ndarray]  # equal-length columns: "id" (S), "label" (int32), and per target others
_FNV_OFFSET, _FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)
PER_CLASS_LISTED = 1000  # the report lists the per-class counts up to this many classes (min / max always)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over a uint64 array (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def row_keys(ids: np.ndarray, seed: int) -> np.ndarray:
    """A seeded 64-bit hash of each id (fixed-width bytes): the same id and seed always give the same key."""
    ids = np.ascontiguousarray(ids, dtype=ids.dtype if ids.dtype.kind == "S" else "S")
    width = ids.dtype.itemsize
    raw = np.frombuffer(ids.tobytes(), np.uint8).reshape(len(ids), width) if len(ids) else np.zeros((0, 1), np.uint8)
    with np.errstate(over="ignore"):
        h = np.full(len(ids), _FNV_OFFSET, np.uint64) ^ _mix(np.array([seed & (2**64 - 1)], np.uint64))
        for j in range(raw.shape[1]):
            byte = raw[:, j].astype(np.uint64)
            h = np.where(byte != 0, (h ^ byte) * _FNV_PRIME, h)  # NUL padding is not part of an id
        return _mix(h)


def quotas(counts: np.ndarray, size: int, seed: int) -> np.ndarray:
    """Rows to take per class: as equal as COUNTS allow, summing to min(SIZE, total); 0 SIZE: every row.

    The classes that get one more than the others (when SIZE does not divide evenly) are a seeded choice."""
    counts = np.asarray(counts, np.int64)
    if size <= 0 or size >= counts.sum():
        return counts.copy()
    lo, hi = 0, int(counts.max())
    while lo < hi:  # the largest level q with sum(min(counts, q)) <= size
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if np.minimum(counts, mid).sum() <= size else (lo, mid - 1)
    take = np.minimum(counts, lo)
    rest = size - int(take.sum())
    room = np.flatnonzero(counts > lo)  # rest < len(room), since level lo + 1 would exceed SIZE
    take[np.random.default_rng([seed, 1]).choice(room, rest, replace=False)] += 1
    return take


def _concat(parts: Sequence[Columns]) -> Columns:
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _take(cols: Columns, index: np.ndarray) -> Columns:
    return {k: v[index] for k, v in cols.items()}


def _rank_in_class(codes: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(order by class then key, each row's rank within its class in that order)."""
    order = np.lexsort((keys, codes))
    sorted_codes = codes[order]
    starts = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]]) if len(order) else order
    first = np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    return order, np.arange(len(order)) - first


@dataclass
class SampleReport:
    """What a check read, for its report: requested size, rows checked, the split's rows, balance."""

    requested: int
    seed: int
    total: int
    checked: int
    unit: str  # rows | whole shards
    balance: dict[str, Any]
    scanned: float = 1.0  # the share of the split read to choose it (a Cassandra sample: a share of the ring)

    @property
    def full(self) -> bool:
        return self.checked == self.total

    def summary(self) -> str:
        """One line: what was checked of what, and how balanced."""
        b = self.balance
        what = "every row" if self.requested == 0 else f"sample {self.requested} (seed {self.seed})"
        read = f", chosen from {self.scanned:.1%} of the rows" if self.scanned < 1 else ""
        return (
            f"{what}: {self.checked} of {self.total} images in {self.unit}, per class "
            f"{b['per_class_min']}-{b['per_class_max']} over {b['classes']} classes{read}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "sample": self.requested,
            "sample_seed": self.seed,
            "split_rows": self.total,
            "checked": self.checked,
            "full_read": self.full,
            "sample_unit": self.unit,
            "scanned_share": round(self.scanned, 4),
            "balance": self.balance,
        }


def balance(labels: np.ndarray, classes: np.ndarray) -> dict[str, Any]:
    """Per-class counts of LABELS over CLASSES (every class of the split): min, max, and the counts themselves
    (up to PER_CLASS_LISTED classes)."""
    classes = np.asarray(classes)
    got = np.zeros(len(classes), np.int64)
    if len(labels) and len(classes):
        u, c = np.unique(labels, return_counts=True)
        got[np.searchsorted(classes, u)] = c
    out: dict[str, Any] = {
        "classes": len(classes),
        "classes_checked": int((got > 0).sum()),
        "per_class_min": int(got.min()) if len(got) else 0,
        "per_class_max": int(got.max()) if len(got) else 0,
    }
    if len(classes) <= PER_CLASS_LISTED:
        out["per_class"] = {str(int(k)): int(v) for k, v in zip(classes, got, strict=True)}
    return out


class ClassCounts:
    """Rows per label of a stream of label chunks (labels may be any int32)."""

    def __init__(self) -> None:
        self.labels = np.zeros(0, np.int32)
        self.counts = np.zeros(0, np.int64)

    def add(self, labels: np.ndarray) -> None:
        u, c = np.unique(labels, return_counts=True)
        both = np.union1d(self.labels, u).astype(np.int32)
        counts = np.zeros(len(both), np.int64)
        counts[np.searchsorted(both, self.labels)] += self.counts
        counts[np.searchsorted(both, u)] += c
        self.labels, self.counts = both, counts

    @property
    def total(self) -> int:
        return int(self.counts.sum())


class BalancedSample:
    """Feed chunks of Columns with ``add``; ``result`` gives the seeded class-balanced sample of SIZE rows (every
    row when SIZE is 0; EMPTY when no row came) and its report. Between chunks at most about
    2 * (SIZE + classes) candidates are held."""

    def __init__(self, size: int, seed: int, empty: Columns, known: ClassCounts | None = None) -> None:
        self.size, self.seed, self.empty = max(0, size), seed, empty
        self.seen = ClassCounts()
        self.known = known  # the split's counts per class when the rows fed are a uniform share of it
        self._parts: list[Columns] = []
        self._held = 0
        self._bound = 0

    def add(self, chunk: Columns) -> None:
        n = len(chunk["id"])
        if n == 0:
            return
        self.seen.add(chunk["label"])
        if self.size:
            chunk = {**chunk, "_key": row_keys(chunk["id"], self.seed)}
        self._parts.append(chunk)
        self._held += n
        if self.size and self._held > max(2 * (self.size + len(self.seen.labels)), self._bound):
            self._prune()

    @property
    def held(self) -> int:
        """Candidate rows held now (bounded by about 2 * (SIZE + classes) plus one chunk, whatever the split)."""
        return self._held

    def _candidates(self) -> Columns:
        cols = _concat(self._parts) if len(self._parts) > 1 else self._parts[0]
        self._parts = [cols]
        return cols

    def _prune(self) -> None:
        """Keep per class the (level + 1) smallest keys: no later row can raise a class's final quota above it."""
        cols = self._candidates()
        level = int(self.quotas().max())
        codes = np.searchsorted(self.seen.labels, cols["label"])
        order, rank = _rank_in_class(codes, cols["_key"])
        keep = np.sort(order[rank <= level])
        self._parts = [_take(cols, keep)]
        self._held = len(keep)
        self._bound = 2 * self._held  # prune again only after the candidates doubled

    @property
    def counts(self) -> ClassCounts:
        """The split's counts per class the quotas follow: the KNOWN ones, else those of the rows fed."""
        return self.known if self.known is not None else self.seen

    def quotas(self) -> np.ndarray:
        """Rows to take per class of :attr:`counts` (its labels' order)."""
        return quotas(self.counts.counts, self.size, self.seed)

    def short(self) -> int:
        """Classes whose rows fed so far are fewer than their quota (0 without KNOWN counts: the rows are the split)."""
        if self.known is None or not self.size:
            return 0
        got = np.zeros(len(self.known.labels), np.int64)
        hit = np.isin(self.seen.labels, self.known.labels)
        got[np.searchsorted(self.known.labels, self.seen.labels[hit])] = self.seen.counts[hit]
        return int((got < self.quotas()).sum())

    def result(self) -> tuple[Columns, SampleReport]:
        """The chosen rows (ordered by key, classes mixed; stream order for a full read) and the report."""
        if not self._parts:
            return self.empty, SampleReport(self.size, self.seed, 0, 0, "rows", balance(np.zeros(0), np.zeros(0)))
        cols = self._candidates()
        counts = self.counts
        total = counts.total
        if self.size and self.size < total:
            take = self.quotas()
            cols = _take(cols, np.flatnonzero(np.isin(cols["label"], counts.labels)))  # KNOWN's classes only
            codes = np.searchsorted(counts.labels, cols["label"])
            order, rank = _rank_in_class(codes, cols["_key"])
            chosen = order[rank < take[codes[order]]]
            cols = _take(cols, chosen[np.argsort(cols["_key"][chosen], kind="stable")])
        cols = {k: v for k, v in cols.items() if k != "_key"}
        report = SampleReport(
            self.size, self.seed, total, len(cols["id"]), "rows", balance(cols["label"], counts.labels)
        )
        return cols, report


def pick_shards(names: Sequence[str], samples: Sequence[int], size: int, seed: int) -> np.ndarray:
    """Indices (in NAMES order) of a seeded subset of whole shards holding at least SIZE samples (every shard
    when SIZE is 0 or at least their total): shards in seeded order until the samples reach SIZE."""
    counts = np.asarray(samples, np.int64)
    if size <= 0 or size >= counts.sum():
        return np.arange(len(names))
    order = np.argsort(row_keys(np.array(list(names), dtype="S"), seed), kind="stable")
    enough = int(np.searchsorted(np.cumsum(counts[order]), size)) + 1
    return np.sort(order[:enough])


class IdIndex:
    """Position of an id in a column of fixed-width byte ids (a sorted copy and binary search, no dict)."""

    def __init__(self, ids: np.ndarray) -> None:
        self.order = np.argsort(ids, kind="stable")
        self.sorted = ids[self.order]
        self.width = ids.dtype.itemsize

    def find(self, key: str) -> int:
        """The position of KEY, or -1."""
        raw = key.encode()
        if not raw or len(raw) > self.width or not len(self.sorted):
            return -1
        j = int(np.searchsorted(self.sorted, raw))
        return int(self.order[j]) if j < len(self.sorted) and self.sorted[j] == raw else -1
