"""The refresh plan at a dataset's scale: ids stay Arrow columns and parquet files, not Python objects per row.

A synthetic 300,000-row dataset with a previous version (baseline, shard plan, state) and a scan that removed a
third of it, changed a few images and added a few: ``plan_refresh`` must hold no Python object per row of the
dataset (tracemalloc sees Python objects and numpy arrays; Arrow's buffers are its own) and must plan exactly
what it planned before (digests of the plan, delta and removed rows taken from the list-based code).
"""

from __future__ import annotations

import hashlib
import json
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from imgest.core import workdir
from imgest.flow import refresh
from imgest.flow.request import IngestRequest
from imgest.sinks.shards.plan import build_plan
from imgest.sources.diff import HASH_COLUMN
from imgest.sources.manifest import SCHEMA, image_id

ROWS = 300_000
CLASSES = 100
ADDED, CHANGED = 20, 10
DATASET = "syn-refresh"


def _table(root: Path, count: int, first: int = 0) -> pa.Table:
    """COUNT manifest rows (train split, class folders), numbered from FIRST, in class order as a scan writes them."""
    n = np.arange(first, first + count)
    labels = (n * CLASSES // max(ROWS, first + count)).astype(np.int32)
    wnids = np.char.add("n", np.char.zfill(labels.astype(str), 8))
    rel = np.char.add(np.char.add(np.char.add("train/", wnids), "/img_"), n.astype(str))
    rel = np.char.add(rel, ".JPEG").astype(str)
    ids = [image_id(DATASET, "train", r) for r in rel.tolist()]
    meta = {"dataset": DATASET, "layout": "imagefolder", "root": str(root)}
    return pa.table(
        {
            "id": pa.array(ids, pa.string()),
            "split": pa.array(["train"] * count, pa.string()),
            "rel_path": pa.array(rel.tolist(), pa.string()),
            "wnid": pa.array(wnids.tolist(), pa.string()),
            "label": pa.array(labels, pa.int32()),
            "size": pa.array(1000 + n % 997, pa.int64()),
            "mtime": pa.array(1_700_000_000.0 + n, pa.float64()),
            "container": pa.array([""] * count, pa.string()),
            "offset": pa.array(np.full(count, -1), pa.int64()),
            "etag": pa.array([""] * count, pa.string()),
        },
        schema=SCHEMA.with_metadata(meta),
    )


def _write_file(root: Path, row: dict, data: bytes) -> dict:
    path = root / row["rel_path"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return {**row, "size": len(data)}


def _scenario(tmp: Path, target: str, transform_changed: bool, removed_every: int) -> tuple[dict, Path]:
    """The previous version's files under $IMGEST_HOME and the new scan's work folder; returns (conf, manifest dir)."""
    root = tmp / "src"
    conf = {"source": str(root), "dataset": DATASET, "target": target, "shard_max_count": 500, "image_mode": "jpeg"}
    request = IngestRequest.from_conf(conf)
    rdir = refresh.refresh_dir(DATASET, target)
    rdir.mkdir(parents=True)
    old = _table(root, ROWS)
    digests = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(ROWS)]
    pq.write_table(old.append_column(HASH_COLUMN, pa.array(digests, pa.string())), rdir / refresh.BASELINE)
    old_manifest = tmp / "old" / workdir.MANIFEST
    old_manifest.parent.mkdir()
    pq.write_table(old, old_manifest, row_group_size=50_000)
    if target == "shards":
        build_plan(old_manifest, rdir / refresh.PLAN, request.shards(), request.transform())
    version = refresh.version_name(request, 1)
    if transform_changed:
        version = "t-0123456789ab-r1"
    (rdir / refresh.STATE).write_text(json.dumps({"number": 1, "version": version, "counts": {}}))
    keep = np.arange(ROWS) % removed_every != 1
    new = old.filter(pa.array(keep))
    changed = [
        _write_file(root, row, f"changed {i}".encode()) for i, row in enumerate(new.slice(0, CHANGED).to_pylist())
    ]
    added = [
        _write_file(root, row, f"added {i}".encode()) for i, row in enumerate(_table(root, ADDED, ROWS).to_pylist())
    ]
    head = pa.Table.from_pylist(changed, schema=new.schema)
    tail = pa.Table.from_pylist(added, schema=new.schema)
    new = pa.concat_tables([head, new.slice(CHANGED), tail])
    work = workdir.dataset_workdir(DATASET)
    work.mkdir(parents=True, exist_ok=True)
    pq.write_table(new, work / workdir.MANIFEST, row_group_size=50_000)
    for name in (workdir.CLASSES, workdir.SCAN_QUARANTINE, workdir.SCAN_REPORT):
        (work / name).write_text("{}")
    return conf, work


def _digest(table: pa.Table) -> str:
    """sha256 of TABLE's rows, column by column (metadata ignored)."""
    h = hashlib.sha256()
    for name in table.column_names:
        h.update(name.encode())
        for value in table.column(name).to_pylist():
            h.update(repr(value).encode())
    return h.hexdigest()


def _outputs(target: str, plan: dict) -> dict[str, str]:
    rdir = refresh.refresh_dir(DATASET, target)
    out = {"counts": json.dumps(plan["counts"], sort_keys=True)}
    if target == "shards":
        table = pq.read_table(rdir / refresh.NEXT_PLAN)
        out["plan"] = _digest(table.replace_schema_metadata(None))
        pending = json.loads((rdir / refresh.PENDING).read_text())
        shards = [pending["kept_shards"], pending["dropped_shards"], pending["new_shards"]]
        out["shards"] = f"{shards[0]} kept, {len(shards[1])} dropped, {len(shards[2])} new"
        out["shard_names"] = hashlib.sha256(json.dumps(shards).encode()).hexdigest()
    else:
        out["delta"] = _digest(pq.read_table(rdir / refresh.DELTA / workdir.MANIFEST).select(["id", "split", "size"]))
    removed = refresh.removed_rows(rdir)
    out["removed"] = _digest(removed.sort_by("id"))
    return out


# Taken from the list-based plan (before ids were kept as Arrow columns): the same input plans the same output.
EXPECTED = {
    "shards": {
        "counts": '{"added": 20, "changed": 10, "removed": 300, "unchanged": 299690}',
        # deletion vectors (issue #24): every shard kept, its removed and changed rows marked dead; one new shard
        # for the 10 changed and 20 added images (the re-cut plan was cf0cbb11..., "348 kept, 252 dropped, 252 new")
        "plan": "ce0efc02c22e36fa5de5907c2784e945122834454088c681e0fd50722dde7cc4",
        "shards": "600 kept, 0 dropped, 1 new",
        "shard_names": "dbb63d5d9f8db609f0ade0fea40c027ca811e9a8321a42fbb2cbf5f15e23be6a",
        "removed": "d251753dfdf485210bfb092d175f58b09881aad629076f7ec372d2c4e2883969",
    },
    "cassandra": {
        "counts": '{"added": 20, "changed": 200000, "removed": 100000, "unchanged": 0}',
        "delta": "da15f38275aa481060187d6c97c0379ef3a6a700a01eb93e11e88a1a19f1e5f6",
        "removed": "23c1e937bcb265ca5b1b0dfc74e6f6c9f47beb438f48dd1a1415503bf6398c3d",
    },
}


# shards: 300 scattered images removed (most shards kept); cassandra: a new transform (every image changed) and a
# third of the images removed. The shards case (23 s) runs in the full tier only.
CASES = [pytest.param("shards", False, 1000, marks=pytest.mark.slow), ("cassandra", True, 3)]


@pytest.mark.parametrize(("target", "transform_changed", "removed_every"), CASES)
def test_plan_holds_no_python_object_per_row_and_plans_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, transform_changed: bool, removed_every: int
) -> None:
    monkeypatch.setenv("IMGEST_HOME", str(tmp_path / "home"))
    conf, work = _scenario(tmp_path, target, transform_changed, removed_every)
    tracemalloc.start()
    try:
        plan = refresh.plan_refresh(conf, work)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    removed = ROWS // removed_every
    kept = ROWS - removed
    changed = kept if transform_changed else CHANGED
    assert plan["changed"] is True
    assert plan["counts"] == {"added": ADDED, "changed": changed, "removed": removed, "unchanged": kept - changed}
    assert _outputs(target, plan) == EXPECTED[target]
    # A few numpy bytes a row (masks and positions); the list-based plan peaked at 130 (shards) and 195 (cassandra)
    # bytes a row: a Python str per id and per source hash.
    assert peak < 24 * ROWS + 2 * 2**20, peak
    pending = json.loads((refresh.refresh_dir(DATASET, target) / refresh.PENDING).read_text())
    assert "removed" not in pending  # the removed ids are a parquet file, not a JSON list
    assert refresh.removed_rows(refresh.refresh_dir(DATASET, target)).num_rows == removed
