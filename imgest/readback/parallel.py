"""Several DALI pipelines read as one: each reads its own part of the sample (``shard_id`` of ``num_shards``) and
every ``run()`` returns one batch of each, as one batch.

DALI's own ``s3://`` reading (``fn.readers.webdataset`` over S3 URLs) issues its ranged GETs one after another from
one loader thread, so one reader is bounded by the server's round trip; K pipelines keep K requests in flight.
Each pipeline's part is DALI's sharding of the sample (``size * shard_id // num_shards`` to the next), each pads
its last batch, and the padding is dropped here: an epoch returns every sample of the sample exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from imgest.readback.pipelines import READER


class ConcatOutput:
    """One output of a ParallelPipes batch: the first N samples of each pipeline's output, in turn, with what the
    readers use of a TensorList (``len``, ``at(i)``, ``[i]``)."""

    def __init__(self, parts: list[tuple[Any, int]]) -> None:
        self.parts = parts

    def __len__(self) -> int:
        return sum(n for _, n in self.parts)

    def _find(self, i: int) -> tuple[Any, int]:
        for part, n in self.parts:
            if i < n:
                return part, i
            i -= n
        raise IndexError(i)

    def at(self, i: int) -> Any:
        part, j = self._find(i)
        return part.at(j)

    def __getitem__(self, i: int) -> Any:
        part, j = self._find(i)
        return part[j]


class ParallelPipes:
    """PIPES (built with ``shard_id`` i of ``num_shards`` len(PIPES), ``pad_last_batch``) run as one pipeline over
    the sample of SIZE samples: ``run()`` returns a batch of each pipeline still in its part, and raises
    StopIteration once every part is read."""

    def __init__(self, pipes: Sequence[Any], size: int) -> None:
        k = len(pipes)
        self.pipes, self.size = list(pipes), size
        self.device_id = self.pipes[0].device_id
        self.left = [size * (i + 1) // k - size * i // k for i in range(k)]

    def epoch_size(self, name: str = READER) -> int:
        return self.size

    def run(self) -> tuple[ConcatOutput, ...]:
        live = [i for i, n in enumerate(self.left) if n > 0]
        if not live:
            raise StopIteration
        for i in live:  # every pipeline's iteration scheduled before waiting on any: their first batches (and
            self.pipes[i].schedule_run()  # the prefetch behind them) are read at once, not one pipeline after another
        outs = [(i, self.pipes[i].outputs()) for i in live]
        taken = []
        for i, out in outs:
            n = min(len(out[0]), self.left[i])
            self.left[i] -= n
            taken.append((out, n))
        return tuple(ConcatOutput([(out[c], n) for out, n in taken]) for c in range(len(outs[0][1])))
