"""Resuming a reader mid-epoch, also with another number of ranks: a small JSON state and the plan it implies.

The epoch's order depends on (seed, epoch, units) only, never on the number of ranks. Units are what a reader
fetches in one go: one id for Cassandra and files, one shard (with its sample count) for shard datasets. The
units are permuted with numpy's generator seeded by ``[seed, epoch]`` (for one-sample units this is exactly the
order of ``cassandra.epoch_order``), and the epoch's sample sequence is each unit's samples in turn.

The part of that sequence still to read is cut into ``world_size`` contiguous parts, at unit boundaries, as even
as the units allow (one-sample units: exactly ``np.array_split``). Each rank records what it delivered as offsets
into its part: a prefix count (``done``) plus the offsets delivered past it (``ahead``, as ranges: readers that
complete out of order). That is all a state holds per rank, so it stays small.

A restore with another world size freezes the current cut (world size and delivered offsets per rank) into the
state's history and cuts what remains anew; replaying the history gives the remainder exactly, however many
times the world size changed, so the union of what every rank delivers over the epoch is the epoch's samples,
each once.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from imgest.core.errors import ImgestError

log = logging.getLogger(__name__)
FORMAT = "imgest-reader-state"
VERSION = 1


class ResumeError(ImgestError):
    """A reader state does not fit the dataset or the readers it is given to."""


@dataclass(frozen=True)
class Units:
    """What an epoch permutes: unit names (ids or shard objects) and samples per unit, with a fingerprint."""

    names: Sequence[str] | np.ndarray
    sizes: np.ndarray
    fingerprint: str

    @classmethod
    def of_ids(cls, ids: Sequence[str] | np.ndarray) -> Units:
        """One unit per id (Cassandra rows, files); IDS as text or a column of UTF-8 bytes."""
        return cls(ids, np.ones(len(ids), np.int64), _fingerprint(ids, None))

    @classmethod
    def of_shards(cls, names: Sequence[str], samples: Sequence[int]) -> Units:
        """One unit per shard, with its sample count (the manifest's ``samples``)."""
        sizes = np.asarray(samples, np.int64)
        if len(sizes) != len(names) or (sizes < 0).any():
            raise ResumeError(f"{len(names)} shards need as many sample counts >= 0 (got {len(sizes)})")
        return cls(list(names), sizes, _fingerprint(names, sizes))

    @property
    def samples(self) -> int:
        return int(self.sizes.sum())


def _fingerprint(names: Sequence[str] | np.ndarray, sizes: np.ndarray | None) -> str:
    h = hashlib.sha256()
    for chunk in range(0, len(names), 65_536):
        part = names[chunk : chunk + 65_536]
        items = part.tolist() if isinstance(part, np.ndarray) else list(part)
        h.update(b"\n".join(i if isinstance(i, bytes) else str(i).encode() for i in items) + b"\n")
    if sizes is not None:
        h.update(sizes.astype("<i8").tobytes())
    return h.hexdigest()[:16]


@dataclass
class RankProgress:
    """What one rank delivered of its part: a prefix of DONE offsets and the offsets past it in AHEAD."""

    done: int = 0
    ahead: set[int] = field(default_factory=set)

    def add(self, offset: int) -> bool:
        """Record OFFSET; False if it was delivered already."""
        if offset < self.done or offset in self.ahead:
            return False
        self.ahead.add(offset)
        while self.done in self.ahead:
            self.ahead.discard(self.done)
            self.done += 1
        return True

    @property
    def count(self) -> int:
        return self.done + len(self.ahead)

    def offsets(self) -> np.ndarray:
        """Every delivered offset."""
        return np.concatenate([np.arange(self.done, dtype=np.int64), np.array(sorted(self.ahead), np.int64)])

    def to_json(self) -> dict[str, Any]:
        return {"done": self.done, "ahead": _ranges(sorted(self.ahead))}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RankProgress:
        ahead = {i for a, b in doc.get("ahead", []) for i in range(int(a), int(b))}
        return cls(int(doc["done"]), ahead)


def _ranges(values: list[int]) -> list[list[int]]:
    """Sorted VALUES as [start, stop) ranges."""
    out: list[list[int]] = []
    for v in values:
        if out and out[-1][1] == v:
            out[-1][1] = v + 1
        else:
            out.append([v, v + 1])
    return out


class Plan:
    """The epoch's sample sequence and every rank's part of what remains, for one state over one set of units."""

    def __init__(self, units: Units, seed: int, epoch: int, history: list[dict[str, Any]], world_size: int) -> None:
        self.perm = np.random.default_rng([seed, epoch]).permutation(len(units.sizes))
        sizes = units.sizes[self.perm]
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)  # of each permuted unit
        remaining = np.arange(units.samples, dtype=np.int64)
        for gen in history:
            keep = np.ones(len(remaining), bool)
            cuts = self._cut(remaining, int(gen["world_size"]))
            for (a, b), doc in zip(cuts, gen["ranks"], strict=True):
                offsets = RankProgress.from_json(doc).offsets()
                if len(offsets) and offsets.max() >= b - a:
                    raise ResumeError("the state's history does not fit this dataset: was it saved for another one?")
                keep[a + offsets] = False
            remaining = remaining[keep]
        self.remaining = remaining
        self.cuts = self._cut(remaining, world_size)

    def _slot(self, positions: np.ndarray) -> np.ndarray:
        """Index into the permuted units of each epoch position."""
        return np.searchsorted(self.starts, positions, side="right") - 1

    def _cut(self, seq: np.ndarray, parts: int) -> list[tuple[int, int]]:
        """PARTS contiguous [a, b) slices of SEQ, cut at unit boundaries nearest an even split."""
        n = len(seq)
        slots = self._slot(seq)
        bounds = np.concatenate([[0], np.flatnonzero(slots[1:] != slots[:-1]) + 1, [n]])
        edges = [0]
        for r in range(1, parts):
            target = r * (n // parts) + min(r, n % parts)
            j = int(np.searchsorted(bounds, target))
            lo, hi = bounds[max(j - 1, 0)], bounds[min(j, len(bounds) - 1)]
            edges.append(max(edges[-1], int(lo if target - lo <= hi - target else hi)))
        edges.append(n)
        return [(edges[i], edges[i + 1]) for i in range(parts)]

    def part(self, rank: int) -> np.ndarray:
        """Epoch positions of RANK's part, in reading order (offset k is the k-th)."""
        a, b = self.cuts[rank]
        return self.remaining[a:b]

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(unit index into Units.names, sample index inside that unit) of each epoch position."""
        slot = self._slot(positions)
        return self.perm[slot], positions - self.starts[slot]


@dataclass
class Assignment:
    """One reader's share of a rank's part: units to fetch in order, and per sample its unit, index and offset."""

    unit: np.ndarray  # index into Units.names, per sample
    within: np.ndarray  # sample index inside its unit
    offset: np.ndarray  # offset in the rank's part (what the state records)

    def __len__(self) -> int:
        return len(self.offset)

    def runs(self) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """(unit, sample indices wanted, their offsets) per consecutive unit, in reading order."""
        if not len(self.unit):
            return []
        bounds = np.concatenate([[0], np.flatnonzero(self.unit[1:] != self.unit[:-1]) + 1, [len(self.unit)]])
        return [(int(self.unit[a]), self.within[a:b], self.offset[a:b]) for a, b in itertools.pairwise(bounds)]


class ReaderState:
    """Where an epoch stands: seed, epoch, world size, and what each rank delivered; JSON via state_dict().

    Readers ask it what to read (``assignment``) and report what they handed over (``mark``). A training script
    saves ``state_dict()`` beside its model checkpoint (merged over ranks: ``ReaderState.merge``) and restores it
    with ``load_state_dict``; ``set_world_size`` before reading when the number of ranks changed.
    """

    def __init__(self, seed: int = 0, world_size: int = 1, epoch: int = 0) -> None:
        if world_size < 1:
            raise ResumeError(f"world_size must be >= 1 (got {world_size})")
        self.seed, self.epoch, self.world_size = int(seed), int(epoch), int(world_size)
        self.history: list[dict[str, Any]] = []
        self.ranks = [RankProgress() for _ in range(self.world_size)]
        self.fingerprint: str | None = None
        self.samples: int | None = None
        self._plan: tuple[tuple[Any, ...], Plan] | None = None

    def __getstate__(self) -> dict[str, Any]:  # DataLoader workers get the state without its cached plan
        return {**self.__dict__, "_plan": None}

    # --- what a training script calls -------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Start EPOCH (nothing delivered); a no-op when it is the current epoch, so a restored one goes on."""
        if int(epoch) != self.epoch:
            self.epoch = int(epoch)
            self.history = []
            self.ranks = [RankProgress() for _ in range(self.world_size)]

    def set_world_size(self, world_size: int) -> None:
        """Read the rest of the epoch with WORLD_SIZE ranks: what was delivered so far stays delivered."""
        if world_size < 1:
            raise ResumeError(f"world_size must be >= 1 (got {world_size})")
        if world_size == self.world_size:
            return
        if any(r.count for r in self.ranks):
            self.history.append({"world_size": self.world_size, "ranks": [r.to_json() for r in self.ranks]})
        self.world_size = int(world_size)
        self.ranks = [RankProgress() for _ in range(self.world_size)]

    def samples_done(self) -> list[int]:
        """Samples each rank delivered since the last change of world size."""
        return [r.count for r in self.ranks]

    def delivered(self) -> int:
        """Samples of the epoch delivered so far, over every rank and every world size."""
        past = sum(RankProgress.from_json(d).count for g in self.history for d in g["ranks"])
        return past + sum(self.samples_done())

    def state_dict(self) -> dict[str, Any]:
        """The state as plain JSON types."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "seed": self.seed,
            "epoch": self.epoch,
            "world_size": self.world_size,
            "samples_done": self.samples_done(),
            "ranks": [r.to_json() for r in self.ranks],
            "history": self.history,
            "fingerprint": self.fingerprint,
            "samples": self.samples,
        }

    def load_state_dict(self, doc: dict[str, Any]) -> None:
        """Take over DOC (from state_dict(), possibly of another world size)."""
        if doc.get("format") != FORMAT or int(doc.get("version", 0)) > VERSION:
            raise ResumeError(f"not an {FORMAT} (version <= {VERSION}) document: format={doc.get('format')!r}")
        self.seed, self.epoch, self.world_size = int(doc["seed"]), int(doc["epoch"]), int(doc["world_size"])
        self.history = [dict(g) for g in doc.get("history", [])]
        self.ranks = [RankProgress.from_json(r) for r in doc["ranks"]]
        if len(self.ranks) != self.world_size:
            raise ResumeError(f"state has {len(self.ranks)} rank entries for world_size {self.world_size}")
        self.fingerprint, self.samples = doc.get("fingerprint"), doc.get("samples")
        self._plan = None

    @classmethod
    def from_state_dict(cls, doc: dict[str, Any]) -> ReaderState:
        state = cls()
        state.load_state_dict(doc)
        return state

    @classmethod
    def merge(cls, docs: Iterable[dict[str, Any] | ReaderState]) -> ReaderState:
        """One state from every rank's own (each knows what its rank delivered): the union per rank."""
        states = [d if isinstance(d, ReaderState) else cls.from_state_dict(d) for d in docs]
        if not states:
            raise ResumeError("merge needs at least one state")
        first = states[0]
        merged = cls.from_state_dict(first.state_dict())
        for other in states[1:]:
            same = (other.seed, other.epoch, other.world_size, other.history)
            if same != (first.seed, first.epoch, first.world_size, first.history):
                raise ResumeError(
                    "ranks' states differ in seed, epoch, world size or history: save them at the same step on "
                    f"every rank (got epoch {first.epoch} and {other.epoch})"
                )
            merged.fingerprint = merged.fingerprint or other.fingerprint
            merged.samples = merged.samples if merged.samples is not None else other.samples
            for mine, theirs in zip(merged.ranks, other.ranks, strict=True):
                for off in theirs.offsets().tolist():
                    mine.add(off)
        return merged

    # --- what a reader calls ----------------------------------------------------------------------------------
    def plan(self, units: Units) -> Plan:
        """The plan of the current epoch over UNITS (cached until the state changes)."""
        if self.fingerprint is None:
            self.fingerprint, self.samples = units.fingerprint, units.samples
        elif self.fingerprint != units.fingerprint:
            raise ResumeError(
                f"this reader state was saved for another dataset (fingerprint {self.fingerprint}, these "
                f"{len(units.sizes)} units give {units.fingerprint}): give each reader the state of its own data"
            )
        key = (units.fingerprint, self.seed, self.epoch, self.world_size, repr(self.history))
        if self._plan is None or self._plan[0] != key:
            self._plan = (key, Plan(units, self.seed, self.epoch, self.history, self.world_size))
        return self._plan[1]

    def assignment(self, units: Units, rank: int, worker: int = 0, workers: int = 1) -> Assignment:
        """What is left for RANK to read this epoch; WORKER of WORKERS gets every WORKERS-th unit run of it."""
        if not 0 <= rank < self.world_size:
            raise ResumeError(f"rank {rank} is outside world_size {self.world_size}: call set_world_size first")
        plan = self.plan(units)
        part = plan.part(rank)
        unit, within = plan.locate(part)
        offset = np.arange(len(part), dtype=np.int64)
        progress = self.ranks[rank]
        left = offset >= progress.done
        if progress.ahead:
            left &= ~np.isin(offset, np.fromiter(progress.ahead, np.int64))
        unit, within, offset = unit[left], within[left], offset[left]
        if workers > 1:
            bounds = np.concatenate([[0], np.flatnonzero(unit[1:] != unit[:-1]) + 1]) if len(unit) else np.zeros(0)
            run = np.zeros(len(unit), np.int64)
            run[bounds.astype(np.int64)] = 1
            mine = (np.cumsum(run) - 1) % workers == worker
            unit, within, offset = unit[mine], within[mine], offset[mine]
        return Assignment(unit, within, offset)

    def mark(self, rank: int, offsets: Iterable[int]) -> None:
        """RANK handed over the samples at OFFSETS of its part (from Assignment.offset)."""
        progress = self.ranks[rank]
        for off in offsets:
            if not progress.add(int(off)):
                raise ResumeError(f"rank {rank} delivered offset {int(off)} twice in epoch {self.epoch}")
