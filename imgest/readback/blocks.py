"""DALI's s3:// reader over the shards in blocks taken in a seeded random order, so any part of a read is spread over
the whole sample.

DALI's webdataset reader reads its files in list order, each by its DALI index. A read cut by the check's budget
therefore measures the first shards only, and on a server whose cost per ranged read varies with the place (the
embedded SeaweedFS gzips some of an object's 4 MiB chunks, and then inflates the whole chunk for every ranged read
inside it: 22 ms per read there against 1.7 ms elsewhere) that rate is not the rate of the sample. Here each shard's
index is split into blocks of consecutive samples, each block written as an index file of its own beside the same
tar, and the (tar, block) pairs are listed in a seeded random order: DALI reads each block as a small file, in order
inside the block, and every prefix of the list is a random sample of places in every shard. A full read of the same
list reads every sample once, as the plain list does (docs/readback.md, "DALI's s3:// reader").
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from imgest.core.errors import ImgestError


def block_lists(
    read_index: Callable[[str], bytes],
    base: str,
    shards: Sequence[str],
    indexes: Sequence[str],
    folder: Path,
    block: int,
    seed: int = 0,
) -> tuple[list[str], list[str]]:
    """(paths, index paths) for fn.readers.webdataset: each of SHARDS (under BASE) once per BLOCK consecutive samples
    of its index (INDEXES, read by READ_INDEX), the block's index written under FOLDER, in an order shuffled by SEED.
    Every sample of every index is in exactly one block."""
    if block < 1:
        raise ValueError(f"block must be at least 1 sample, not {block}")
    pairs: list[tuple[str, str]] = []
    for n, (shard, index) in enumerate(zip(shards, indexes, strict=True)):
        version, lines = parse_index(read_index(index), index)
        for j in range(0, len(lines), block):
            part = lines[j : j + block]
            path = folder / f"{n:06d}-{j // block:06d}.idx"
            path.write_text(f"{version} {len(part)}\n" + "\n".join(part) + "\n")
            pairs.append((f"{base.rstrip('/')}/{shard}", str(path)))
    random.Random(seed).shuffle(pairs)
    return [p for p, _ in pairs], [i for _, i in pairs]


def parse_index(raw: bytes, where: str) -> tuple[str, list[str]]:
    """(version, sample lines) of the DALI index RAW (the object WHERE): a ``v1.2 <count>`` header line, then one
    line per sample; a count that disagrees with the lines is an error naming WHERE."""
    head, *body = raw.decode().splitlines()
    lines = [line for line in body if line.strip()]
    fields = head.split()
    if len(fields) != 2 or not fields[1].isdigit() or int(fields[1]) != len(lines):
        raise ImgestError(f"DALI index {where}: header {head!r} does not match its {len(lines)} sample lines")
    return fields[0], lines


def index_reader(store: Any) -> Callable[[str], bytes]:
    """A READ_INDEX for block_lists over STORE (a ShardStore): an index that is missing is an error naming it (the
    packer writes one beside each shard)."""

    def read(name: str) -> bytes:
        raw = store.read_bytes(name)
        if raw is None:
            raise FileNotFoundError(f"DALI index {store.location}/{name} is missing")
        return bytes(raw)

    return read
