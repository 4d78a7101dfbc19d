"""The Cassandra verify sample (imgest.sinks.cassandra.verify.expected_counts) from a bounded pool (issue #41): the
same rows as ranking every row of the manifest, at any number of labels, sample size, batch size and quarantine,
while the pool stays at about the sample's size however many labels there are.

The reference below is the sample's definition, computed over the whole manifest at once: a seeded key per row
(one ``rng.random`` draw per non-empty batch, as the manifest is read), each row's rank by key within its label,
then the first SAMPLE rows by (rank, key)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imgest.sinks.cassandra import verify
from imgest.sources.manifest import SCHEMA, image_id


def _manifest(path: Path, labels: list[int]) -> list[str]:
    rel = [f"train/n{lab:08d}/img_{i}.JPEG" for i, lab in enumerate(labels)]
    ids = [image_id("vs", "train", r) for r in rel]
    n = len(labels)
    table = pa.table(
        {
            "id": ids,
            "split": ["train" if i % 5 else "val" for i in range(n)],
            "rel_path": rel,
            "wnid": [f"n{lab:08d}" for lab in labels],
            "label": pa.array(labels, pa.int32()),
            "size": pa.array(range(n), pa.int64()),
            "mtime": pa.array([1.0] * n),
            "container": [""] * n,
            "offset": pa.array([-1] * n, pa.int64()),
            "etag": [""] * n,
        },
        schema=SCHEMA,
    )
    pq.write_table(table, path)
    return ids


def _reference(path: Path, quarantined: set[str], sample: int, seed: int, batch: int) -> list[str]:
    rng = np.random.default_rng([seed, 11])
    ids, labels, keys = [], [], []
    for rows in pq.ParquetFile(path).iter_batches(batch_size=batch):
        rows = rows.filter(pc.invert(pc.is_in(rows.column("id"), value_set=pa.array(sorted(quarantined), pa.string()))))
        if sample <= 0 or not rows.num_rows:
            continue
        ids += rows.column("id").to_pylist()
        labels += rows.column("label").to_pylist()
        keys += rng.random(rows.num_rows).tolist()
    by_label: dict[int, list[tuple[float, str]]] = {}
    for i, lab, key in zip(ids, labels, keys, strict=True):
        by_label.setdefault(lab, []).append((key, i))
    ranked = [(rank, key, i) for rows in by_label.values() for rank, (key, i) in enumerate(sorted(rows))]
    return [i for _, _, i in sorted(ranked)[:sample]]


@given(
    labels=st.lists(st.integers(0, 12), min_size=0, max_size=160),
    sample=st.integers(0, 40),
    seed=st.integers(0, 3),
    batch=st.sampled_from([1, 3, 7, 64]),
    skip=st.integers(0, 5),
)
@settings(max_examples=150, deadline=None)
def test_sample_is_the_whole_manifest_ranking(
    tmp_path_factory: pytest.TempPathFactory, labels: list[int], sample: int, seed: int, batch: int, skip: int
) -> None:
    path = tmp_path_factory.mktemp("vs") / "manifest.parquet"
    ids = _manifest(path, labels)
    quarantined = set(ids[::7][:skip])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(verify, "BATCH_ROWS", batch)
        expected, picked = verify.expected_counts(path, quarantined, sample, seed)
    assert [c.id for c in picked] == _reference(path, quarantined, sample, seed, batch)
    kept = [(i, lab) for n, (i, lab) in enumerate(zip(ids, labels, strict=True)) if i not in quarantined]
    splits = ["train" if n % 5 else "val" for n in range(len(ids))]
    want = Counter(f"{s}/{lab}" for (i, lab), s in zip(kept, [splits[ids.index(i)] for i, _ in kept], strict=True))
    assert expected == want


def test_pool_stays_near_the_sample_size_at_many_labels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """3,000 labels of 4 rows, sample 32: the pool never holds more than the sample and one batch (it held 32 rows a
    label, 12,000 here, before), and the sample is still one row of each of 32 labels."""
    labels = [n // 4 for n in range(12_000)]
    path = tmp_path / "manifest.parquet"
    _manifest(path, labels)
    held: list[int] = []
    prune = verify._prune

    def counted(pool: pa.Table, sample: int, floors: verify._Floors) -> pa.Table:
        out = prune(pool, sample, floors)
        held.append(out.num_rows)
        return out

    monkeypatch.setattr(verify, "_prune", counted)
    monkeypatch.setattr(verify, "BATCH_ROWS", 500)
    _, picked = verify.expected_counts(path, set(), 32, 0)
    assert max(held) <= 32 + 1  # a tie at the last key aside
    assert sorted(Counter(c.label for c in picked).values()) == [1] * 32
    assert [c.id for c in picked] == _reference(path, set(), 32, 0, 500)
