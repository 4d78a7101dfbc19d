"""The refresh plan's memory stays flat at ImageNet's count (issue #24), and it plans what it planned before.

``plan_refresh`` compares the scan with the baseline by 64-bit id keys held in numpy (a few bytes a row) and reads
both parquet files in bounded chunks: a diff of 1,331,167 rows must hold a bounded number of bytes a row (Python
objects and numpy arrays seen by tracemalloc, Arrow's peak allocation in a process of its own). A small source with
every kind of change (added, changed bytes, changed label, removed, touched with the same bytes, an S3 ETag kept or
changed, an unreadable suspect, rows out of the baseline's order) must plan exactly what the scenario made: the
test keeps, as it builds the source, which rows it added, changed and removed and which bytes each one holds, and
derives the expected counts, next baseline, delta and removed rows from that.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from imgest.core import workdir
from imgest.core.idhash import id_hashes
from imgest.flow import refresh
from imgest.flow.request import IngestRequest
from imgest.sources import diff_index
from imgest.sources.diff import HASH_COLUMN
from imgest.sources.manifest import SCHEMA, image_id

DATASET = "syn-flat"
SMALL = 2000
IMAGENET = 1_331_167


def _small_rows(root: Path) -> list[dict]:
    """SMALL manifest rows; every fifth is an S3 object (an ETag)."""
    rows = []
    for i in range(SMALL):
        label = i * 10 // SMALL
        rel = f"train/n{label:08d}/img_{i}.JPEG"
        rows.append(
            {
                "id": image_id(DATASET, "train", rel),
                "split": "train",
                "rel_path": rel,
                "wnid": f"n{label:08d}",
                "label": label,
                "size": len(f"img {i}"),
                "mtime": 1_700_000_000.0 + i,
                "container": "",
                "offset": -1,
                "etag": f"etag-{i}" if i % 5 == 0 else "",
            }
        )
    return rows


def _file(root: Path, row: dict, data: bytes) -> dict:
    path = root / row["rel_path"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return {**row, "size": len(data)}


def _small_scenario(tmp: Path) -> tuple[dict, Path, dict]:
    """A previous version (baseline, state) and a scan with every kind of change; returns (conf, manifest dir, what
    the plan must write: see _expected)."""
    root = tmp / "src"
    conf = {"source": str(root), "dataset": DATASET, "target": "cassandra", "image_mode": "jpeg"}
    request = IngestRequest.from_conf(conf)
    rdir = refresh.refresh_dir(DATASET, "cassandra")
    rdir.mkdir(parents=True)
    old = _small_rows(root)
    meta = {"dataset": DATASET, "layout": "imagefolder", "root": str(root)}
    hashes = [hashlib.sha256(f"img {i}".encode()).hexdigest() for i in range(SMALL)]
    base = pa.Table.from_pylist(old, schema=SCHEMA.with_metadata(meta))
    pq.write_table(base.append_column(HASH_COLUMN, pa.array(hashes)), rdir / refresh.BASELINE, row_group_size=300)
    state = {"number": 1, "version": refresh.version_name(request, 1), "counts": {}}
    (rdir / refresh.STATE).write_text(json.dumps(state))
    new: list[dict] = []
    held: dict[str, bytes | None] = {}  # id -> the bytes its source holds now (None: the file is gone)
    changed: set[str] = set()
    for i, row in enumerate(old):
        if i % 9 == 1:
            continue  # removed
        same = f"img {i}".encode()
        data: bytes | None = same
        if row["etag"]:
            if i % 11 == 4:  # re-uploaded with the same bytes: a new ETag, read, unchanged
                row = _file(root, {**row, "etag": f"etag-{i}-b"}, same)
            elif i % 19 == 5:  # a new upload time, the same ETag: unchanged, not read
                row = {**row, "mtime": row["mtime"] + 7}
        elif i % 13 == 2:  # touched: a new mtime, the same bytes
            row = _file(root, {**row, "mtime": row["mtime"] + 1}, same)
        elif i % 17 == 3:  # new bytes
            data = f"new image {i}".encode()
            row = _file(root, {**row, "mtime": row["mtime"] + 1}, data)
            changed.add(row["id"])
        elif i % 23 == 6:  # the same bytes under another label
            row = _file(root, {**row, "label": row["label"] + 1}, same)
            changed.add(row["id"])
        elif i % 29 == 7:  # a suspect whose file is gone when it is hashed: changed (the ingest quarantines it)
            row, data = {**row, "size": row["size"] + 1}, None
            changed.add(row["id"])
        new.append(row)
        held[row["id"]] = data
    added: set[str] = set()
    for i in range(SMALL, SMALL + 15):
        rel = f"train/n00000009/img_{i}.JPEG"
        row = {**old[-1], "id": image_id(DATASET, "train", rel), "rel_path": rel, "etag": ""}
        new.append(_file(root, row, f"added {i}".encode()))
        held[row["id"]] = f"added {i}".encode()
        added.add(row["id"])
    new = new[: len(new) // 2] + new[len(new) // 2 :][::-1]  # out of the baseline's order
    work = workdir.dataset_workdir(DATASET)
    work.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(new, schema=SCHEMA.with_metadata(meta)), work / workdir.MANIFEST, 250)
    for name in (workdir.CLASSES, workdir.SCAN_QUARANTINE, workdir.SCAN_REPORT):
        (work / name).write_text("{}")
    return conf, work, _expected(old, new, held, changed, added)


def _expected(old: list[dict], new: list[dict], held: dict, changed: set[str], added: set[str]) -> dict:
    """What a plan of the scan NEW over the baseline OLD writes: the counts; the next baseline (the scan, in its
    order, with the sha256 of the bytes each source holds, "" for a file gone); the delta (the added and changed
    rows of the scan, in its order); the removed rows ((id, split) of the baseline's rows the scan lacks, in the
    baseline's order)."""
    scanned = {r["id"] for r in new}
    removed = [{"id": r["id"], "split": r["split"]} for r in old if r["id"] not in scanned]
    counts = {"added": len(added), "changed": len(changed), "removed": len(removed)}
    counts["unchanged"] = len(new) - len(added) - len(changed)
    digest = {i: "" if b is None else hashlib.sha256(b).hexdigest() for i, b in held.items()}
    return {
        "counts": counts,
        "baseline": [{**r, HASH_COLUMN: digest[r["id"]]} for r in new],
        "delta": [r for r in new if r["id"] in added | changed],
        "removed": removed,
    }


def test_small_plan_is_what_the_scenario_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IMGEST_HOME", str(tmp_path / "home"))
    conf, work, expected = _small_scenario(tmp_path)
    assert expected["counts"] == {"added": 15, "changed": 174, "removed": 223, "unchanged": 1603}  # every kind made
    assert _small_outputs(refresh.plan_refresh(conf, work)) == expected


def _small_outputs(plan: dict) -> dict:
    """What PLAN wrote: counts, the next baseline, the delta manifest and the removed rows (rows as dicts)."""
    rdir = refresh.refresh_dir(DATASET, "cassandra")
    return {
        "counts": plan["counts"],
        "baseline": pq.read_table(rdir / refresh.NEXT_BASELINE).to_pylist(),
        "delta": pq.read_table(rdir / refresh.DELTA / workdir.MANIFEST).to_pylist(),
        "removed": refresh.removed_rows(rdir).to_pylist(),
    }


def _first_seed_collides(ids: pa.Array | pa.ChunkedArray, seed: int) -> np.ndarray:
    """64-bit keys under which many baseline ids share a key with seed 0 (the index must try the next seed)."""
    keys = id_hashes(ids, seed)
    return keys % np.uint64(997) if seed == 0 else keys


def _added_ids_collide(ids: pa.Array | pa.ChunkedArray, seed: int) -> np.ndarray:
    """64-bit keys under which each added image's id shares the key of a baseline id (kept or removed)."""
    as_old = {image_id(DATASET, "train", f"train/n00000009/img_{SMALL + i}.JPEG"): _small_id(i * 7) for i in range(15)}
    return id_hashes(pa.array([as_old.get(i, i) for i in pc.cast(ids, pa.string()).to_pylist()]), seed)


def _small_id(i: int) -> str:
    return image_id(DATASET, "train", f"train/n{i * 10 // SMALL:08d}/img_{i}.JPEG")


# A collision of 64-bit keys cannot be produced for real (about 1 in 10^7 at ImageNet's count): the key function
# is replaced by one that collides. Either way the ids are compared and the plan is the same.
@pytest.mark.parametrize("keys", [_first_seed_collides, _added_ids_collide])
def test_a_key_collision_plans_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keys: object) -> None:
    monkeypatch.setenv("IMGEST_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(diff_index, "id_hashes", keys)
    conf, work, expected = _small_scenario(tmp_path)
    assert _small_outputs(refresh.plan_refresh(conf, work)) == expected


def test_a_baseline_whose_ids_collide_under_every_seed_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IMGEST_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(diff_index, "id_hashes", lambda ids, seed: np.zeros(len(ids), np.uint64))
    conf, work, _ = _small_scenario(tmp_path)
    with pytest.raises(diff_index.BaselineError, match=r"baseline\.parquet: different ids share a 64-bit key"):
        refresh.plan_refresh(conf, work)


def _large(root: Path, count: int, first: int = 0) -> pa.Table:
    """COUNT manifest rows numbered from FIRST (36-character ids, 1,000 classes), built as Arrow columns."""
    n = pa.array(np.arange(first, first + count))
    text = pc.cast(n, pa.string())
    labels = pa.array((np.arange(first, first + count) * 1000 // IMAGENET).astype(np.int32))
    names = pa.array([f"n{i:08d}" for i in range(1001)])
    wnids = pc.take(names, labels)
    meta = {"dataset": DATASET, "layout": "imagefolder", "root": str(root)}
    columns = {
        "id": pc.utf8_lpad(text, 36, "0"),
        "split": pa.array(np.full(count, "train")),
        "rel_path": pc.binary_join_element_wise("train/", wnids, "/img_", text, ".JPEG", ""),
        "wnid": wnids,
        "label": labels,
        "size": pc.add(pc.bit_wise_and(n, 1023), 1000),
        "mtime": pc.add(pc.cast(n, pa.float64()), 1_700_000_000.0),
        "container": pa.array(np.full(count, "")),
        "offset": pa.array(np.full(count, -1, np.int64)),
        "etag": pa.array(np.full(count, "")),
    }
    return pa.table(columns, schema=SCHEMA.with_metadata(meta))


def _large_scenario(tmp: Path) -> tuple[dict, Path]:
    """A previous version of IMAGENET rows and a scan with 0.1 % of them removed, 10 changed and 20 added."""
    root = tmp / "src"
    conf = {"source": str(root), "dataset": DATASET, "target": "cassandra", "image_mode": "jpeg"}
    rdir = refresh.refresh_dir(DATASET, "cassandra")
    rdir.mkdir(parents=True)
    old = _large(root, IMAGENET)
    hashes = pc.utf8_lpad(pc.cast(old.column("id"), pa.string()), 64, "f")
    pq.write_table(old.append_column(HASH_COLUMN, hashes), rdir / refresh.BASELINE, row_group_size=65_536)
    state = {"number": 1, "version": refresh.version_name(IngestRequest.from_conf(conf), 1), "counts": {}}
    (rdir / refresh.STATE).write_text(json.dumps(state))
    new = old.filter(pa.array(np.arange(IMAGENET) % 1000 != 999))
    changed = [_file(root, row, f"changed {i}".encode()) for i, row in enumerate(new.slice(0, 10).to_pylist())]
    added = [_file(root, row, f"added {i}".encode()) for i, row in enumerate(_large(root, 20, IMAGENET).to_pylist())]
    new = pa.concat_tables(
        [pa.Table.from_pylist(changed, new.schema), new.slice(10), pa.Table.from_pylist(added, new.schema)]
    )
    work = workdir.dataset_workdir(DATASET)
    work.mkdir(parents=True, exist_ok=True)
    pq.write_table(new, work / workdir.MANIFEST, row_group_size=8192)  # as the scan writes it
    for name in (workdir.CLASSES, workdir.SCAN_QUARANTINE, workdir.SCAN_REPORT):
        (work / name).write_text("{}")
    return conf, work


# The plan in a process of its own (Arrow's peak allocation is counted from the process's start): peaks of traced
# Python and numpy memory and of Arrow's allocations during plan_refresh, and the plan.
_MEASURE = """
import json, sys, tracemalloc
from pathlib import Path
import pyarrow as pa
from imgest.flow import refresh
conf, work = json.loads(sys.argv[1]), Path(sys.argv[2])
pa.array([""])  # pyarrow imports pandas at its first conversion: a fixed cost, not the plan's
pool = pa.default_memory_pool()
start = pool.max_memory()
tracemalloc.start()
plan = refresh.plan_refresh(conf, work)
traced = tracemalloc.get_traced_memory()[1]
print(json.dumps({"plan": plan, "traced": traced, "arrow": pool.max_memory() - start}))
"""


def _measured(conf: dict, work: Path) -> dict:
    """plan_refresh(CONF, WORK) run by _MEASURE in a process of its own: the plan and its memory peaks."""
    run = subprocess.run(
        [sys.executable, "-c", _MEASURE, json.dumps(conf), str(work)], capture_output=True, text=True, check=True
    )
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # 1.33 M rows: the full tier's, not the quick one's
def test_plan_at_imagenet_count_holds_a_few_bytes_a_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IMGEST_HOME", str(tmp_path / "home"))
    out = _measured(*_large_scenario(tmp_path))
    removed = IMAGENET // 1000
    kept = IMAGENET - removed
    assert out["plan"]["counts"] == {"added": 20, "changed": 10, "removed": removed, "unchanged": kept - 10}
    rdir = refresh.refresh_dir(DATASET, "cassandra")
    assert pq.read_metadata(rdir / refresh.NEXT_BASELINE).num_rows == kept + 20
    delta = pq.read_table(rdir / refresh.DELTA / workdir.MANIFEST, columns=["id"]).column("id").to_pylist()
    assert delta == [str(i).zfill(36) for i in [*range(10), *range(IMAGENET, IMAGENET + 20)]]
    gone = refresh.removed_rows(rdir).column("id").to_pylist()
    assert gone == [str(i).zfill(36) for i in range(999, IMAGENET, 1000)]
    # Numpy keys and masks: 12 bytes a baseline row and a byte a row of each file, 20 while the keys are sorted
    # (measured: 20 bytes a row); Arrow holds a batch of each file whatever their size (measured: 22 MiB). The
    # whole-table plan peaked at 660 Arrow bytes a row (837 MiB at this count).
    assert out["traced"] < 24 * IMAGENET + 4 * 2**20, out
    assert out["arrow"] < 48 * 2**20, out


def _as_shards(conf: dict) -> dict:
    """CONF's scenario (a Cassandra refresh folder) made a shards one: the previous version's plan is its baseline
    cut 1,000 rows a shard, in baseline order."""
    cassandra, shards = refresh.refresh_dir(DATASET, "cassandra"), refresh.refresh_dir(DATASET, "shards")
    cassandra.rename(shards)
    old = pq.read_table(shards / refresh.BASELINE).drop_columns([HASH_COLUMN])
    index = np.arange(old.num_rows)
    names = pa.array([f"train-{i:06d}.tar" for i in range(old.num_rows // 1000 + 1)])
    old = old.append_column("shard", pc.take(names, pa.array(index // 1000)))
    old = old.append_column("pos", pa.array((index % 1000).astype(np.int32)))
    pq.write_table(old, shards / refresh.PLAN, row_group_size=65_536)  # a refresh's plan: any row groups
    return {**conf, "target": "shards", "s3_dest": "s3://imgest/syn-flat"}


def _large_shard_scenario(tmp: Path) -> tuple[dict, Path]:
    """_large_scenario for the shards target."""
    conf, work = _large_scenario(tmp)
    return _as_shards(conf), work


def test_a_new_transform_replans_the_shards_out_of_core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every row changed (a new transform) keeps no shard: the plan is cut as a first version's is (build_plan, in
    bounded memory), not by the re-plan, which would hold every row of the manifest to cut it."""
    monkeypatch.setenv("IMGEST_HOME", str(tmp_path / "home"))
    conf, work, _ = _small_scenario(tmp_path)
    conf = {**_as_shards(conf), "image_mode": "unchanged"}  # the baseline's version was written in jpeg mode
    plan = refresh.plan_refresh(conf, work)
    assert plan["counts"]["unchanged"] == 0
    pending = json.loads((refresh.refresh_dir(DATASET, "shards") / refresh.PENDING).read_text())
    assert "kept_shards" not in pending  # not re-planned
    written = pq.ParquetFile(refresh.refresh_dir(DATASET, "shards") / refresh.NEXT_PLAN)
    assert written.metadata.num_rows == pq.read_metadata(work / workdir.MANIFEST).num_rows
    assert "dead" not in written.schema_arrow.names


@pytest.mark.slow
def test_shard_replan_at_imagenet_count_holds_a_few_bytes_a_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shards target's plan: every old shard kept (its removed and changed rows marked dead), one new shard for
    the 30 written rows, in memory that does not grow with the plan (the whole-table re-plan peaked at 1.5 GiB)."""
    monkeypatch.setenv("IMGEST_HOME", str(tmp_path / "home"))
    out = _measured(*_large_shard_scenario(tmp_path))
    removed = IMAGENET // 1000
    rdir = refresh.refresh_dir(DATASET, "shards")
    pending = json.loads((rdir / refresh.PENDING).read_text())
    assert (pending["kept_shards"], pending["marked_shards"], pending["dropped_shards"]) == (1332, removed, [])
    assert (pending["new_shards"], pending["dead_samples"]) == (["train-001332.tar"], removed + 10)
    plan = pq.ParquetFile(rdir / refresh.NEXT_PLAN)
    assert plan.metadata.num_rows == IMAGENET + 30
    assert plan.metadata.num_row_groups == 1333  # one row group a shard, in shard order
    last = plan.read_row_group(1332, columns=["id", "shard", "dead"])
    assert sorted(last.column("id").to_pylist()) == [
        str(i).zfill(36) for i in [*range(10), *range(IMAGENET, IMAGENET + 20)]
    ]
    assert not pc.any(last.column("dead")).as_py()
    assert out["traced"] < 24 * IMAGENET + 4 * 2**20, out
    assert out["arrow"] < 48 * 2**20, out
