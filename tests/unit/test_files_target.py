"""The files target without Spark: merging the partitions' parts of samples.parquet, versioned publishing, the
collector and the verifier, on real files (a generated dataset in the published layout)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from imgest.cli import main as cli
from imgest.readback.datasets import files_set
from imgest.sinks.files.gc import collect_files
from imgest.sinks.files.layout import SAMPLES_COLUMNS, FilesDatasetError, data_root, iter_files, read_manifest
from imgest.sinks.files.sample import write_files_dataset
from imgest.sinks.files.verify import verify_files
from imgest.sinks.files.write import merge_parts, samples_schema
from imgest.validate.dataset import load_splits


def _rows(n: int, rng: random.Random) -> list[dict[str, object]]:
    rows = []
    for _ in range(n):
        split, wnid, image = rng.choice(["train", "val"]), f"n{rng.randrange(40):08d}", f"{rng.getrandbits(48):012x}"
        path = f"{split}/{wnid}/{image}.jpg"
        rows.append({"id": image, "path": path, "label": 0, "split": split, "wnid": wnid, "bytes": 1, "sha256": ""})
    return rows


def _part(path: Path, rows: list[dict[str, object]]) -> Path:
    table = pa.Table.from_pylist(rows, schema=samples_schema()).sort_by("path")
    pq.write_table(table, path, row_group_size=100)
    return path


@pytest.mark.parametrize("fan_in", [64, 3])  # one merge, and merges in rounds
def test_parts_merge_into_one_sorted_table_a_bounded_batch_at_a_time(tmp_path: Path, fan_in: int) -> None:
    rng = random.Random(5)
    parts, every = [], []
    for i, n in enumerate([700, 0, 1, 1300, 450, 999, 2, 820]):
        rows = _rows(n, rng)
        every += rows
        if rows:
            parts.append(_part(tmp_path / f"part-{i:05d}.parquet", rows))
    out = tmp_path / "samples.parquet"
    stats = merge_parts(parts, out, batch_rows=256, fan_in=fan_in)
    table = pq.read_table(out)
    assert table.schema.names == list(SAMPLES_COLUMNS)
    assert stats.rows == table.num_rows == len(every)
    assert table.column("path").to_pylist() == sorted(r["path"] for r in every)
    assert sorted(table.column("id").to_pylist()) == sorted(r["id"] for r in every)
    assert stats.peak_rows <= 2 * 256 + 64 * min(fan_in, len(parts))  # never the whole table
    assert stats.passes == (1 if fan_in >= len(parts) else 4)  # 7 parts in threes: 3 + 1 merges, then the last
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*(p.name for p in parts), "samples.parquet"])


def _dataset(root: Path, **kw: int) -> dict[str, int]:
    return write_files_dataset(root, **{"classes": 3, "per_class": 6, "val_per_class": 2, "large_every": 0, **kw})


def test_publish_switches_versions_by_manifest_and_gc_keeps_current_and_keep(tmp_path: Path) -> None:
    dest = tmp_path / "ds"
    _dataset(dest, seed=1)
    first = read_manifest(dest)["root"]
    first_files = [data_root(dest) / f.path for f in iter_files(dest)]
    assert first.startswith("v/")
    assert (dest / first / "samples.parquet").is_file()
    assert not (dest / "_staging").exists() or not any((dest / "_staging").iterdir())

    _dataset(dest, seed=2)
    doc = read_manifest(dest)
    second = doc["root"]
    assert second != first
    assert doc["history"] == [first]
    assert all(p.is_file() for p in first_files)  # the old version is still there, untouched
    assert str(data_root(dest)) == files_set(dest).root == str(dest / second)

    _dataset(dest, seed=3)
    third = read_manifest(dest)["root"]
    assert read_manifest(dest)["history"] == [second, first]
    (dest / "_staging" / "stale-key").mkdir(parents=True)  # what a failed job left
    (dest / "v" / "orphan").mkdir()  # renamed, never named by a manifest

    dry = collect_files(dest, keep=1, dry_run=True)
    assert sorted(dry.removed) == sorted([first, "v/orphan", "_staging/stale-key"])
    assert (dest / first).is_dir()
    done = collect_files(dest, keep=1)
    assert sorted(done.kept) == sorted([third, second])
    assert sorted(p.name for p in (dest / "v").iterdir()) == sorted([third[2:], second[2:]])
    assert not (dest / "_staging").exists()
    assert cli(["gc", "files", str(dest), "--keep", "0"]) == 0
    assert [p.name for p in (dest / "v").iterdir()] == [third[2:]]
    assert verify_files(dest).ok


def test_same_arguments_publish_the_same_folder_again(tmp_path: Path) -> None:
    dest = tmp_path / "ds"
    _dataset(dest, seed=4)
    before = json.loads((dest / "manifest.json").read_text())
    _dataset(dest, seed=4)
    after = json.loads((dest / "manifest.json").read_text())
    assert before == after
    assert after["history"] == []
    assert len(list((dest / "v").iterdir())) == 1
    assert verify_files(dest, sample=0).ok


def test_readers_follow_the_manifest_and_a_removed_version_is_named(tmp_path: Path) -> None:
    dest = tmp_path / "ds"
    counts = _dataset(dest)
    views = load_splits(dest)
    assert {v.split: len(v) for v in views} == counts
    assert all(v.root == data_root(dest) for v in views)
    import shutil

    shutil.rmtree(data_root(dest))
    with pytest.raises(FilesDatasetError, match="removed by hand"):
        data_root(dest)


def test_verify_finds_missing_resized_and_corrupted_files(tmp_path: Path) -> None:
    dest = tmp_path / "ds"
    _dataset(dest, classes=4, per_class=10, val_per_class=3)
    folder = data_root(dest)
    report = verify_files(dest, sample=4, seed=0)
    assert report.ok
    assert not report.full
    assert report.rows == report.files == 52
    assert report.hashed == 8
    assert report.samples["train"]["checked"] == 4
    assert report.samples["train"]["per_class_max"] == 1
    sampled = {s.decode() for s in _sampled_paths(dest, 4)}
    files = [f.path for f in iter_files(dest)]
    inside = next(p for p in files if p in sampled)
    outside = [p for p in files if p not in sampled]

    data = (folder / inside).read_bytes()
    (folder / inside).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, one bit
    (folder / outside[0]).unlink()
    (folder / outside[1]).write_bytes((folder / outside[1]).read_bytes() + b"x")
    bit = folder / outside[2]
    bit.write_bytes(bytes([bit.read_bytes()[0] ^ 1]) + bit.read_bytes()[1:])
    report = verify_files(dest, sample=4, seed=0)
    assert not report.ok
    assert report.missing == [outside[0]]
    assert [m["path"] for m in report.size_mismatches] == [outside[1]]
    assert [m["path"] for m in report.mismatched] == [inside]  # outside[2] is not in the sample
    full = verify_files(dest, sample=0)
    assert full.full
    assert full.hashed == 51
    assert sorted(m["path"] for m in full.mismatched) == sorted([inside, outside[1], outside[2]])
    assert cli(["verify", "files", str(dest), "--full"]) == 1


def _sampled_paths(dest: Path, sample: int) -> list[bytes]:
    """The paths verify_files hashes for SAMPLE per split (seed 0), through the shared sampler."""
    from imgest.core.sampling import BalancedSample
    from imgest.sinks.files.verify import _batches, _columns, _empty

    out = []
    for split in ("train", "val"):
        picker = BalancedSample(sample, 0, _empty())
        for batch in _batches(data_root(dest) / "samples.parquet"):
            cols = _columns(batch)
            keep = cols.pop("split") == split.encode()
            picker.add({k: v[keep] for k, v in cols.items()})
        out += picker.result()[0]["path"].tolist()
    return out
