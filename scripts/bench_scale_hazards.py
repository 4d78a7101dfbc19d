"""Micro-benchmarks of issue #41's three scale hazards, each step in a process of its own (wall time, peak RSS).

    python scripts/bench_scale_hazards.py setup DIR          # inputs: 1.33 M-row manifest and plan, split rows,
                                                             # a 21,841-label manifest (61 rows a label)
    python scripts/bench_scale_hazards.py run STEP DIR       # one step, prints one JSON line
    python scripts/bench_scale_hazards.py all DIR            # every step, one process each

Steps: replan (a 5 % change: 4 % changed, 1 % removed, 1 % added; BENCH_TOUCHED=0.2 at setup for 20 %;
replan_file on the Parquet files), split_bytes (write_split_files of 16-byte ids), cache_save, cache_load,
cache_load_split (--metadata-ifn: load the cache, then split), load_part (load_split + part(0)), verify_sample
(expected_counts, sample 32, seed 0). Run it with PYTHONPATH set to the checkout to measure; RSS "before" is the
process after its inputs were loaded, "peak" its maximum.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROWS = 1_331_167
LABELS, PER_LABEL = 21_841, 61
STEPS = ("replan", "split_bytes", "cache_save", "cache_load", "cache_load_split", "load_part", "verify_sample")


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _current_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


def _manifest(count: int, labels: int, first: int = 0) -> pa.Table:
    from imgest.sources.manifest import SCHEMA, image_id

    n = np.arange(first, first + count)
    lab = (n * labels // max(count, 1)) if first == 0 else n % labels
    rel = [f"train/n{c:08d}/img_{i}.JPEG" for c, i in zip(lab.tolist(), n.tolist(), strict=True)]
    return pa.table(
        {
            "id": pa.array([image_id("bench", "train", r) for r in rel], pa.string()),
            "split": pa.array(["train"] * count, pa.string()),
            "rel_path": pa.array(rel, pa.string()),
            "wnid": pa.array([f"n{c:08d}" for c in lab.tolist()], pa.string()),
            "label": pa.array(lab, pa.int32()),
            "size": pa.array(1000 + n % 997, pa.int64()),
            "mtime": pa.array(1_700_000_000.0 + n, pa.float64()),
            "container": pa.array([""] * count, pa.string()),
            "offset": pa.array(np.full(count, -1), pa.int64()),
            "etag": pa.array([""] * count, pa.string()),
        },
        schema=SCHEMA,
    )


def setup(out: Path) -> None:
    import pyarrow.compute as pc

    from imgest.sinks.shards.plan import ShardSpec, build_plan
    from imgest.transform.image import TransformSpec

    out.mkdir(parents=True, exist_ok=True)
    first = _manifest(ROWS, 1000)
    pq.write_table(first, out / "manifest1.parquet")
    build_plan(out / "manifest1.parquet", out / "plan.parquet", ShardSpec(), TransformSpec(mode="unchanged"))
    rng = np.random.default_rng(41)
    share = float(os.environ.get("BENCH_TOUCHED", "0.05"))  # touched: four fifths changed, one fifth removed
    picked = rng.choice(ROWS, size=int(ROWS * share), replace=False)
    changed, removed = picked[: len(picked) * 4 // 5], picked[len(picked) * 4 // 5 :]
    ids = first.column("id")
    touched = ids.take(pa.array(np.r_[changed, removed])).combine_chunks()
    keep = np.ones(ROWS, bool)
    keep[removed] = False
    new = pa.concat_tables([first.filter(pa.array(keep)), _manifest(ROWS // 100, 1000, first=ROWS)])
    pq.write_table(new, out / "manifest2.parquet")
    rewritten = pc.is_in(new.column("id"), value_set=ids.take(pa.array(changed)).combine_chunks())
    rewritten = pc.or_(rewritten, pc.invert(pc.is_in(new.column("id"), value_set=ids.combine_chunks())))
    np.save(out / "rewritten.npy", rewritten.to_numpy(zero_copy_only=False).astype(bool))
    pq.write_table(pa.table({"id": touched}), out / "touched.parquet")
    raw = np.sort(np.frombuffer(rng.bytes(16 * ROWS), dtype="S16"))
    np.save(out / "ids.npy", raw)
    np.save(out / "labels.npy", rng.integers(0, 1000, ROWS).astype(np.int32))
    pq.write_table(_manifest(LABELS * PER_LABEL, LABELS), out / "verify_manifest.parquet")


def _replan(d: Path) -> dict:
    from imgest.sinks.shards.plan import ShardSpec
    from imgest.sinks.shards.replan import replan_file
    from imgest.transform.image import TransformSpec

    rewritten, touched = np.load(d / "rewritten.npy"), pq.read_table(d / "touched.parquet").column("id")
    before, t = _current_mib(), time.perf_counter()
    r = replan_file(
        d / "plan.parquet",
        d / "manifest2.parquet",
        rewritten,
        touched,
        ShardSpec(),
        TransformSpec(mode="unchanged"),
        2,
        d / "replan-out.parquet",
    )
    wall = time.perf_counter() - t
    digest = _digest(d / "replan-out.parquet")
    return {"wall_s": wall, "rss_before_mib": before, "result": [len(r.kept), len(r.new), r.dead, r.rows, digest]}


def _digest(path: Path) -> str:
    return _file_sha(path)


def _rows(d: Path):
    from imgest.splits.sources import LabelledRows

    return LabelledRows(np.load(d / "ids.npy"), np.load(d / "labels.npy"), 1000, {"kind": "cassandra"})


def _file_sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _timed(fn, before: float) -> dict:
    t = time.perf_counter()
    result = fn()
    return {"wall_s": time.perf_counter() - t, "rss_before_mib": before, "result": result}


def run(step: str, d: Path) -> dict:
    from imgest.splits.split import load_split, write_split_files

    if step == "replan":
        out = _replan(d)
    elif step == "split_bytes":
        rows = _rows(d)
        out = _timed(
            lambda: write_split_files(rows, [8, 2], "original", 0, d / "s1.npz") and _file_sha(d / "s1.npz"),
            _current_mib(),
        )
    elif step == "cache_save":
        rows = _rows(d)

        def save() -> str:
            rows.save(d / "cache.parquet")
            return str(pq.read_schema(d / "cache.parquet").field("id").type)

        out = _timed(save, _current_mib())
    elif step == "cache_load":
        from imgest.splits.sources import LabelledRows

        out = _timed(lambda: str(LabelledRows.load(d / "cache.parquet").ids.dtype), _current_mib())
    elif step == "cache_load_split":
        from imgest.splits.sources import LabelledRows

        def go() -> str:
            rows = LabelledRows.load(d / "cache.parquet")
            write_split_files(rows, [8, 2], "original", 0, d / "s2.npz")
            return _file_sha(d / "s2.npz")

        out = _timed(go, _current_mib())
    elif step == "load_part":
        out = _timed(lambda: str(load_split(d / "s1.npz").part(0)[0][:2].tolist()), _current_mib())
    elif step == "verify_sample":
        from imgest.sinks.cassandra.verify import expected_counts

        def pick() -> list:
            expected, picked = expected_counts(d / "verify_manifest.parquet", set(), 32, 0)
            return [sum(expected.values()), [c.id[:8] for c in picked]]

        out = _timed(pick, _current_mib())
    else:
        raise SystemExit(f"unknown step {step}")
    return {"step": step, **out, "peak_rss_mib": _rss_mib()}


def main(argv: list[str]) -> None:
    if argv[0] == "setup":
        setup(Path(argv[1]))
    elif argv[0] == "run":
        print(json.dumps(run(argv[1], Path(argv[2]))))
    elif argv[0] == "all":
        for step in argv[2:] or STEPS:
            subprocess.run([sys.executable, __file__, "run", step, argv[1]], check=True)


if __name__ == "__main__":
    main(sys.argv[1:])
