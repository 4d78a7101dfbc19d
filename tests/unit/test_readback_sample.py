"""The read-back check's sample: its size, class balance and seed-determinism, chosen from streamed columns."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from imgest.core.sampling import BalancedSample, IdIndex, pick_shards, quotas
from imgest.readback import datasets
from imgest.readback.datasets import ReadSet, files_set, shards_set
from imgest.readback.measure import Verifier
from imgest.sinks.shards.store import open_store


def _rows(per_class: list[int], start: int = 0) -> dict[str, np.ndarray]:
    labels = np.repeat(np.arange(len(per_class), dtype=np.int32), per_class)
    ids = np.array([f"img-{start + i:07d}".encode() for i in range(len(labels))], dtype="S")
    return {"id": ids, "label": labels, "sha256": np.zeros((len(ids), 32), np.uint8)}


def _sample(rows: dict[str, np.ndarray], size: int, seed: int, chunk: int = 97) -> tuple[dict, object, int]:
    picker = BalancedSample(size, seed, {k: v[:0] for k, v in rows.items()})
    peak = 0
    for start in range(0, len(rows["id"]), chunk):
        picker.add({k: v[start : start + chunk] for k, v in rows.items()})
        peak = max(peak, picker.held)
    cols, report = picker.result()
    return cols, report, peak


def test_quotas_are_as_equal_as_the_classes_allow() -> None:
    assert quotas(np.array([100, 100, 100]), 30, 0).tolist() == [10, 10, 10]
    assert quotas(np.array([3, 100, 100]), 31, 0).tolist() == [3, 14, 14]  # a small class gives its rest away
    odd = quotas(np.array([50, 50, 50, 50]), 10, 7)
    assert odd.sum() == 10
    assert sorted(odd.tolist()) == [2, 2, 3, 3]
    assert quotas(np.array([50, 50, 50, 50]), 10, 7).tolist() == odd.tolist()  # the extras are a seeded choice
    assert quotas(np.array([4, 5]), 0, 0).tolist() == [4, 5]  # 0: every row
    assert quotas(np.array([4, 5]), 100, 0).tolist() == [4, 5]


def test_sample_has_the_size_asked_balanced_per_class() -> None:
    rows = _rows([400, 300, 250, 30, 20])  # 1000 rows, two small classes
    cols, report, peak = _sample(rows, 100, seed=3)
    assert len(cols["id"]) == report.checked == 100
    per_class = np.bincount(cols["label"], minlength=5).tolist()
    assert per_class == [20, 20, 20, 20, 20]
    assert report.balance["per_class_min"] == report.balance["per_class_max"] == 20
    assert report.balance["per_class"] == {str(c): 20 for c in range(5)}
    assert report.total == 1000
    assert not report.full
    assert len(set(cols["id"].tolist())) == 100  # no row twice
    chosen = IdIndex(rows["id"])
    for key, label in zip(cols["id"].tolist(), cols["label"].tolist(), strict=True):  # each row is a real one
        assert rows["label"][chosen.find(key.decode())] == label
    assert peak <= 2 * (100 + 5) + 97  # candidates held between chunks stay bounded, not the split's size

    cols, _, _ = _sample(_rows([400, 300, 250, 30, 5]), 100, seed=3)
    assert np.bincount(cols["label"], minlength=5).tolist() == [24, 24, 24, 23, 5]  # the small class gives its rest


def test_same_seed_same_sample_whatever_the_order_and_chunks() -> None:
    rows = _rows([300, 200, 100])
    a, _, _ = _sample(rows, 60, seed=1, chunk=97)
    b, _, _ = _sample(rows, 60, seed=1, chunk=13)
    perm = np.random.default_rng(9).permutation(len(rows["id"]))
    c, _, _ = _sample({k: v[perm] for k, v in rows.items()}, 60, seed=1, chunk=50)
    other, _, _ = _sample(rows, 60, seed=2)
    assert a["id"].tolist() == b["id"].tolist() == c["id"].tolist()  # the same rows in the same (key) order
    assert set(other["id"].tolist()) != set(a["id"].tolist())


def test_zero_or_a_size_past_the_split_reads_every_row_in_order() -> None:
    rows = _rows([7, 5])
    for size in (0, 12, 1000):
        cols, report, _ = _sample(rows, size, seed=0, chunk=5)
        assert cols["id"].tolist() == rows["id"].tolist()
        assert report.full
        assert report.checked == report.total == 12
        assert report.to_dict()["full_read"] is True


def test_pick_shards_covers_the_sample_with_whole_shards() -> None:
    names = [f"train-{i:06d}.tar" for i in range(20)]
    counts = [16] * 19 + [4]
    picked = pick_shards(names, counts, 50, seed=0)
    got = sum(counts[i] for i in picked)
    assert got >= 50
    assert got - min(counts[i] for i in picked) < 50
    assert pick_shards(names, counts, 50, seed=0).tolist() == picked.tolist()
    assert pick_shards(names, counts, 50, seed=1).tolist() != picked.tolist()
    assert pick_shards(names, counts, 0, seed=0).tolist() == list(range(20))


def test_verifier_names_wrong_label_hash_repeat_and_missing() -> None:
    import hashlib

    data = [np.frombuffer(f"image {i}".encode(), np.uint8) for i in range(4)]
    sha = np.stack([np.frombuffer(hashlib.sha256(d.tobytes()).digest(), np.uint8) for d in data])
    rs = ReadSet(
        "files",
        "/x",
        {
            "id": np.array([b"a", b"b", b"c", b"d"]),
            "label": np.array([0, 1, 1, 0], np.int32),
            "sha256": sha,
            "recorded": np.array([True, True, True, False]),
        },
    )
    v = Verifier(rs)
    v.check("a", 0, data[0], None)
    v.check("a", 0, data[0], None)
    v.check("b", 0, data[1], None)
    v.check("c", 1, data[0], None)
    v.check("zz", 0, data[0], None)
    problems = v.finish()
    assert problems[0] == "a: read twice in one epoch"
    assert problems[1] == "b: label 0, recorded 1"
    assert problems[2].startswith("c: sha256 ")
    assert problems[3].startswith("zz: not part of the dataset version")
    assert problems[4] == "1 ids never read, e.g. d"
    v = Verifier(rs)
    for i, key in enumerate("abcd"):
        v.check(key, int(rs.labels[i]), data[i], hashlib.sha256(data[i].tobytes()).hexdigest())
    assert v.finish() == []  # d's sha256 came with the sample


def _files_dataset(root: Path, per_class: list[int]) -> None:
    ids = [f"f{c}-{k:04d}" for c, n in enumerate(per_class) for k in range(n)]
    labels = [c for c, n in enumerate(per_class) for _ in range(n)]
    root.mkdir(parents=True)
    table = pa.table(
        {
            "id": [*ids, "v-0"],
            "path": [f"train/n{c}/{i}.jpg" for i, c in zip(ids, labels, strict=True)] + ["val/n0/v-0.jpg"],
            "label": [*labels, 0],
            "split": ["train"] * len(ids) + ["val"],
            "wnid": [f"n{c}" for c in labels] + ["n0"],
            "bytes": [10] * (len(ids) + 1),
            "sha256": ["ab" * 32] * (len(ids) + 1),
        }
    )
    pq.write_table(table, root / "samples.parquet", row_group_size=64)
    (root / "manifest.json").write_text(json.dumps({"format": "files", "version": "v1"}))


def test_files_set_streams_the_parquet_and_samples_per_class(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasets, "CHUNK", 50)  # several chunks, so candidates are pruned between them
    _files_dataset(tmp_path / "files", [120, 90, 60])
    rs = files_set(tmp_path / "files", "train", sample=30, seed=0)
    assert len(rs) == rs.sample.checked == 30
    assert np.bincount(rs.labels).tolist() == [10, 10, 10]
    assert rs.sample.total == 270
    assert rs.bytes == 300
    assert all(p.startswith(f"{tmp_path}/files/train/n") for p in rs.paths)
    assert rs.rows["sha256"].shape == (30, 32)
    assert rs.rows["recorded"].all()
    assert files_set(tmp_path / "files", "train", sample=30, seed=0).id_list() == rs.id_list()
    every = files_set(tmp_path / "files", "train")
    assert len(every) == 270
    assert every.sample.full


def test_shards_set_reads_whole_shards_and_reports_their_balance(tmp_path: Path) -> None:
    root = tmp_path / "shards"
    root.mkdir()
    rng = np.random.default_rng(0)
    labels = rng.permutation(np.repeat(np.arange(4), 25))  # shuffled at pack time: classes mix
    names = [f"train-{i:06d}.tar" for i in range(10)]
    pq.write_table(
        pa.table(
            {
                "id": [f"s{i:03d}" for i in range(100)],
                "label": labels.tolist(),
                "split": ["train"] * 100,
                "shard": [names[i // 10] for i in range(100)],
                "position": [i % 10 for i in range(100)],
            }
        ),
        root / "samples.parquet",
    )
    shards = [{"name": n, "split": "train", "samples": 10, "bytes": 1000} for n in names]
    (root / "manifest.json").write_text(json.dumps({"format": "webdataset", "shards": shards}))
    rs = shards_set(open_store(str(root)), "train", sample=25, seed=4)
    assert len(rs.shards) == 3
    assert len(rs) == rs.sample.checked == 30
    assert rs.bytes == 3000
    assert rs.sample.total == 100
    assert not rs.sample.full
    ids_in = {f"s{i:03d}" for n in rs.shards for i in range(names.index(n) * 10, names.index(n) * 10 + 10)}
    assert set(rs.id_list()) == ids_in  # every sample of the chosen shards, nothing else
    b = rs.sample.balance
    assert sum(b["per_class"].values()) == 30
    assert b["per_class_min"] == min(b["per_class"].values())
    assert shards_set(open_store(str(root)), "train", sample=25, seed=4).shards == rs.shards
    assert len(shards_set(open_store(str(root)), "train").shards) == 10
