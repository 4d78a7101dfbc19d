"""Refresh building blocks without services: the datasets file, the source diff, the shard re-plan, locks."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from imgest.core import locks
from imgest.core.errors import ConfigError
from imgest.flow.registry import load_registry
from imgest.sinks.shards.plan import ShardSpec, plan_shards
from imgest.sinks.shards.replan import replan
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.diff import diff_manifest
from imgest.sources.scan import scan_to_dir
from imgest.transform.image import TransformSpec


def test_datasets_file_reports_each_bad_entry_and_keeps_the_good(tmp_path: Path) -> None:
    path = tmp_path / "datasets.toml"
    path.write_text(
        '[datasets.good]\nsource = "/data/x"\ntargets = ["shards"]\nschedule = "0 3 * * *"\n\n'
        '[datasets.bad]\nsource = "/data/y"\nresize = "big"\nschedule = "0 3 * *"\n\n'
        '[datasets.worse]\nsource = "/data/z"\ntargets = ["files"]\ncrop = 999\n'
    )
    registry = load_registry(path)
    assert [(e.name, e.schedule, e.targets) for e in registry.entries] == [("good", "0 3 * * *", ("shards",))]
    assert registry.entries[0].conf("shards") == {"source": "/data/x", "dataset": "good", "target": "shards"}
    bad, worse = registry.errors
    assert "[datasets.bad]" in bad
    assert "field 'schedule' '0 3 * *'" in bad
    assert "field 'resize' 'big': must be integer" in bad
    assert "[datasets.worse]" in worse
    assert "field 'targets' ['files']" in worse
    with pytest.raises(ConfigError, match=r"\[datasets.bad\]"):
        registry.entry("bad")


def test_missing_or_broken_datasets_file(tmp_path: Path) -> None:
    assert load_registry(tmp_path / "none.toml").entries == []
    broken = tmp_path / "broken.toml"
    broken.write_text("[datasets.a\n")
    assert "cannot be read as TOML" in load_registry(broken).errors[0]


def _scan(src: Path, out: Path) -> Path:
    scan_to_dir(src, out, "imagefolder", "ds")
    return out / "manifest.parquet"


def test_diff_finds_added_changed_removed_and_ignores_touched(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_sample(src, SampleSpec("imagefolder", classes=2, per_class=4, val_per_class=1, seed=3))
    changes = diff_manifest(_scan(src, tmp_path / "w1"), None, src, tmp_path / "baseline.parquet")
    assert changes.counts() == {"added": 10, "changed": 0, "removed": 0, "unchanged": 0}
    first = pq.read_table(tmp_path / "baseline.parquet")
    assert set(first.column("src_sha256").to_pylist()) == {""}  # a first version reads no file: the ingest will
    # what the ingest recorded (Cassandra's metadata src_sha256), asked for only for rows that look changed
    recorded = {
        row["id"]: hashlib.sha256((src / row["rel_path"]).read_bytes()).hexdigest()
        for row in first.select(["id", "rel_path"]).to_pylist()
    }
    asked: list[tuple[str, str]] = []

    def known(rows: list[tuple[str, str]]) -> dict[str, str]:
        asked.extend(rows)
        return {key: recorded[key] for key, _split in rows}

    files = sorted((src / "train").rglob("*.JPEG"))
    shutil.copyfile(files[0], files[0].with_name("new.JPEG"))  # added
    files[1].write_bytes(files[2].read_bytes())  # changed bytes
    files[3].unlink()  # removed
    later = time.time() + 10
    os.utime(files[4], (later, later))  # touched: same bytes, new mtime
    manifest = _scan(src, tmp_path / "w2")
    changes = diff_manifest(manifest, tmp_path / "baseline.parquet", src, tmp_path / "next.parquet", known=known)
    assert changes.counts() == {"added": 1, "changed": 1, "removed": 1, "unchanged": 8}
    assert changes.touched_same_bytes == 1
    assert sorted(split for _key, split in asked) == ["train", "train"]  # the changed and the touched file only
    # Without the recorded hashes a touched file cannot be told from a changed one: it is re-ingested in place.
    blind = diff_manifest(manifest, tmp_path / "baseline.parquet", src, tmp_path / "blind.parquet")
    assert blind.counts() == {"added": 1, "changed": 2, "removed": 1, "unchanged": 7}
    # Suspects are hashed a chunk at a time: any chunk size gives the same changes and the same new baseline.
    small = diff_manifest(manifest, tmp_path / "baseline.parquet", src, tmp_path / "small.parquet", 1, known)
    large = diff_manifest(manifest, tmp_path / "baseline.parquet", src, tmp_path / "large.parquet", known=known)
    new_small, new_large = pq.read_table(tmp_path / "small.parquet"), pq.read_table(tmp_path / "large.parquet")
    assert (small.added, small.changed, small.removed, small.counts()) == (
        large.added,
        large.changed,
        large.removed,
        large.counts(),
    )
    assert new_small.equals(new_large)
    hashes = dict(zip(new_large.column("id").to_pylist(), new_large.column("src_sha256").to_pylist(), strict=True))
    suspects = {
        row["id"]
        for row in new_large.to_pylist()
        if Path(row["rel_path"]).name in ("new.JPEG", files[1].name, files[4].name)
    }
    assert {key for key, digest in hashes.items() if len(digest) == 64} == suspects  # the files read now
    assert all(hashes[key] == "" for key in hashes.keys() - suspects)  # the others: still the ingest's to tell


def test_replan_keeps_touched_shards_with_dead_rows_and_recuts_past_the_threshold(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_sample(src, SampleSpec("imagefolder", classes=2, per_class=10, val_per_class=0, seed=4))
    manifest = _scan(src, tmp_path / "w")
    spec, tspec = ShardSpec(max_count=4), TransformSpec()
    old = plan_shards(manifest, spec, tspec)
    table = pq.read_table(manifest)
    first = old.slice(0, 1).column("id")[0].as_py()  # in train-000000
    result = replan(old, table.filter(pc.not_equal(table.column("id"), first)), [first], spec, tspec, refresh=2)
    assert (result.dropped, result.new, result.marked, result.dead) == ([], [], ["train-000000.tar"], 1)
    assert result.kept == [f"train-{i:06d}.tar" for i in range(5)]
    plan = result.plan
    assert plan.num_rows == 20  # the removed row stays, dead: the kept tar's digest covers it
    assert plan.filter(plan.column("dead")).column("id").to_pylist() == [first]
    assert plan.drop_columns(["dead"]).to_pylist() == old.to_pylist()  # same rows, same positions
    # a second row of shard 0 gone: 2 of 4 dead is past COMPACT_DEAD_FRACTION, so shard 0 is re-cut
    second = old.slice(1, 1).column("id")[0].as_py()
    left = table.filter(pc.invert(pc.is_in(table.column("id"), value_set=pa.array([first, second]))))
    again = replan(plan, left, [second], spec, tspec, refresh=3)
    assert (again.dropped, again.new, again.marked, again.dead) == (["train-000000.tar"], ["train-000005.tar"], [], 0)
    assert again.kept == [f"train-{i:06d}.tar" for i in range(1, 5)]
    live = again.plan.filter(pc.invert(again.plan.column("dead")))
    assert sorted(live.column("id").to_pylist()) == sorted(left.column("id").to_pylist())
    assert again.plan.num_rows == live.num_rows == 18


def test_lock_refuses_a_second_writer_and_frees_a_dead_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IMGEST_HOME", str(tmp_path))
    first = locks.airflow_holder("refresh_a", "run1")
    assert locks.try_acquire("a", first) is None
    assert locks.try_acquire("a", first) is None  # re-entrant for a retried task
    assert locks.try_acquire("b", locks.cli_holder("imgest ingest")) is None  # other datasets never wait
    with pytest.raises(locks.DatasetBusyError, match="Airflow DAG refresh_a run run1"):
        locks.acquire("a", locks.cli_holder("imgest ingest shards"), wait=0.3, poll=0.1)
    assert locks.release("a", first)
    dead = locks.Holder("cli", "pid 999999 on gone", 999999, __import__("socket").gethostname())
    locks.lock_path("c").write_text(__import__("json").dumps(dead.__dict__))
    assert locks.try_acquire("c", first) is None  # the dead CLI holder's lock is taken over
