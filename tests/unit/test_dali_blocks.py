"""imgest.readback.blocks: each shard's DALI index split into blocks of consecutive samples, each written as an index
of its own beside the same tar, listed in a seeded random order (the check's DALI s3:// reader reads them so that a
read cut by its budget is spread over every shard)."""

from __future__ import annotations

from pathlib import Path

import pytest

from imgest.core.errors import ImgestError
from imgest.readback.blocks import block_lists, index_reader, parse_index


def _index(shard: int, samples: int) -> bytes:
    lines = [
        f"jpg {1536 * i + 512} 4000 s{shard}x{i}.jpg cls {1536 * i + 1024} 1 s{shard}x{i}.cls" for i in range(samples)
    ]
    return (f"v1.2 {samples}\n" + "\n".join(lines) + "\n").encode()


INDEXES = {f"train-{n:06d}.idx": _index(n, size) for n, size in enumerate([100, 100, 100, 37])}
SHARDS = [name[:-4] + ".tar" for name in INDEXES]


def _lists(folder: Path, block: int, seed: int = 0) -> tuple[list[str], list[str]]:
    return block_lists(INDEXES.__getitem__, "s3://b/p/", SHARDS, list(INDEXES), folder, block, seed)


def test_every_sample_is_in_exactly_one_block_in_order_inside_it(tmp_path: Path) -> None:
    paths, indexes = _lists(tmp_path, 8)
    assert len(paths) == len(indexes) == 13 * 3 + 5
    got: dict[str, list[str]] = {}
    for path, index in zip(paths, indexes, strict=True):
        version, lines = parse_index(Path(index).read_bytes(), index)
        assert version == "v1.2"
        assert 1 <= len(lines) <= 8
        got.setdefault(path, []).append(lines)
    for shard, raw in zip(SHARDS, INDEXES.values(), strict=True):
        blocks = sorted(got[f"s3://b/p/{shard}"], key=lambda b: int(b[0].split()[1]))
        assert [line for b in blocks for line in b] == parse_index(raw, shard)[1]


def test_the_order_is_seeded_and_any_first_part_reaches_every_shard(tmp_path: Path) -> None:
    runs = {}
    for name, seed in [("a", 0), ("b", 0), ("c", 1)]:
        (tmp_path / name).mkdir()
        runs[name] = _lists(tmp_path / name, 8, seed)[0]
    paths = runs["a"]
    assert paths == runs["b"]
    assert paths != runs["c"]
    assert paths != sorted(paths)  # not the shards' order
    assert {p.rsplit("/", 1)[1] for p in paths[: len(paths) // 4]} == set(SHARDS)


def test_an_index_whose_count_disagrees_or_is_missing_is_named(tmp_path: Path) -> None:
    with pytest.raises(ImgestError, match=r"DALI index x\.idx: header 'v1.2 3' does not match its 2 sample lines"):
        parse_index(b"v1.2 3\njpg 0 1 a.jpg\njpg 1 1 b.jpg\n", "x.idx")

    class Empty:
        location = "s3://b/p"

        def read_bytes(self, name: str) -> None:
            return None

    with pytest.raises(FileNotFoundError, match=r"DALI index s3://b/p/train-000000\.idx is missing"):
        block_lists(index_reader(Empty()), "s3://b/p", SHARDS[:1], ["train-000000.idx"], tmp_path, 8)
    with pytest.raises(ValueError, match="block must be at least 1"):
        _lists(tmp_path, 0)
