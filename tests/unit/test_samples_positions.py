"""samples.parquet's positions after a refresh: a row's place in its shard's tar is decided per shard, since one id
can be dead in a kept shard and live (or quarantined) in a new one."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

from imgest.sinks.shards.pack_publish import samples_table
from imgest.sinks.shards.pack_record import ShardRecord
from imgest.sinks.shards.plan import DEAD


def _plan(rows: list[tuple[str, str, bool]]) -> pa.Table:
    """A refresh plan of (shard, id, dead) rows in shard order."""
    return pa.table(
        {
            "id": [i for _, i, _ in rows],
            "label": pa.array([0] * len(rows), pa.int32()),
            "split": ["train"] * len(rows),
            "shard": [s for s, _, _ in rows],
            DEAD: [d for _, _, d in rows],
        }
    )


def _record(name: str, quarantine: tuple[str, ...] = (), dead: tuple[str, ...] = ()) -> ShardRecord:
    return ShardRecord(
        name, "train", 0, 0, "", "", f"v/k/{name}.tar", "", "", quarantine=[{"id": q} for q in quarantine], dead=[*dead]
    )


def _positions(plan: pa.Table, records: list[ShardRecord]) -> dict[tuple[str, str], int]:
    table = pq.read_table(io.BytesIO(samples_table(plan, records)))
    shards, ids, positions = (table.column(c).to_pylist() for c in ("shard", "id", "position"))
    return {(s, i): p for s, i, p in zip(shards, ids, positions, strict=True)}


def test_a_quarantined_sample_fixed_by_a_refresh_holds_no_place_in_its_old_tar() -> None:
    # b was corrupt when s1 was written (not in its tar: a, c, d); it was fixed, so it is dead in s1 and live in s2.
    plan = _plan([("s1", "a", False), ("s1", "b", True), ("s1", "c", False), ("s1", "d", False), ("s2", "b", False)])
    records = [_record("s1"), _record("s2")]
    assert _positions(plan, records) == {("s1", "a"): 0, ("s1", "c"): 1, ("s1", "d"): 2, ("s2", "b"): 0}


def test_a_sample_that_turned_corrupt_keeps_its_place_in_the_old_tar() -> None:
    # s1's tar holds a, b, c, d; b changed into a corrupt file: dead in s1 (still in its tar), quarantined in s2.
    plan = _plan([("s1", "a", False), ("s1", "b", True), ("s1", "c", False), ("s1", "d", False), ("s2", "b", False)])
    records = [_record("s1", dead=("b",)), _record("s2", quarantine=("b",))]
    assert _positions(plan, records) == {("s1", "a"): 0, ("s1", "c"): 2, ("s1", "d"): 3}


def test_a_shard_whose_live_rows_were_rewritten_counts_only_them() -> None:
    # s1's kept tar was gone: its live rows a, c were packed into a new tar, which has no dead sample.
    plan = _plan([("s1", "a", False), ("s1", "b", True), ("s1", "c", False)])
    assert _positions(plan, [_record("s1")]) == {("s1", "a"): 0, ("s1", "c"): 1}


def test_a_first_version_plan_without_dead_rows() -> None:
    plan = _plan([("s1", "a", False), ("s1", "b", False), ("s2", "c", False)]).drop_columns([DEAD])
    records = [_record("s1", quarantine=("a",)), _record("s2")]
    assert _positions(plan, records) == {("s1", "b"): 0, ("s2", "c"): 0}
