"""Issue #41: the size of a shard dataset's manifest.json and what the pack job ships to every Spark task.

    PYTHONPATH=<checkout> python scripts/measure_shard_manifest.py [--classes 1000 21841]

Synthetic records at ImageNet's counts (1,000 classes: 1,331,167 images; 21,841 classes: 14,197,122), cut into
shards of 5,000 samples (the default), each shard's samples drawn from every class (the plan shuffles), 1 in
10,000 quarantined. The published manifest is written to a scratch folder as the job would, read back as the job's
driver does on the next run (a refresh), and the pack job's task closure pickled with Spark's cloudpickle. Prints
one JSON line per size: manifest.json bytes, the per-shard table's bytes (when the checkout writes one), the
pickled PackConfig, the pickled task function (sent with every task) and the largest task's data (its shards).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pickle
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

PER_SHARD = 5_000
IMAGES = {1_000: 1_331_167, 21_841: 14_197_122}
SLICES = 64  # 4 x defaultParallelism of a 16-core executor set: the partitions the job cuts its shards into


def _records(classes: int, seed: int = 0) -> list[Any]:
    from imgest.sinks.shards.pack_record import ShardRecord

    rng = np.random.default_rng(seed)
    images = IMAGES.get(classes, classes * 650)
    records = []
    for i in range((images + PER_SHARD - 1) // PER_SHARD):
        n = min(PER_SHARD, images - i * PER_SHARD)
        labels, counts = np.unique(rng.integers(0, classes, n), return_counts=True)
        bad = [
            {
                "path": f"train/n{i:08d}/bad_{j}.JPEG",
                "split": "train",
                "reason": "corrupt",
                "detail": "x",
                "id": f"{i}-{j}",
            }
            for j in range(int(rng.binomial(n, 1e-4)))
        ]
        name = f"train-{i:06d}.tar"
        key = "k" * 64
        records.append(
            ShardRecord(
                name, "train", n - len(bad), n * 110_000, f"{i:064x}", f"{i + 1:064x}", f"v/{key}/{name}",
                f"v/{key}/train-{i:06d}.idx", f"v/{key}/train-{i:06d}.info.json",
                labels={str(k): int(c) for k, c in zip(labels.tolist(), counts.tolist(), strict=True)}, quarantine=bad,
            )
        )  # fmt: skip
    return records


def _task_bytes(cfg: Any, store: Any) -> tuple[int, int]:
    """(pickled task function, pickled data of the largest task) as the pack job hands them to Spark."""
    from pyspark import cloudpickle

    import imgest.jobs.pack_shards as job

    shards = [(e["name"], g) for g, e in enumerate((store.read_manifest() or {}).get("shards", []))]
    if hasattr(job, "shard_task"):  # this change: each task gets its own shards' published fields as its data
        from imgest.sinks.shards.pack_publish import plan_items

        items = plan_items(shards, store.read_manifest(), store, set())
        task = job.shard_task(Path("plan.parquet"), cfg, None, None)
    else:  # before: the whole live manifest's entries inside the config, in the closure of every task
        items = shards

        def task(it: Any) -> list[Any]:
            return [cfg, it]

    per = (len(items) + SLICES - 1) // SLICES
    data = max(len(pickle.dumps(items[at : at + per])) for at in range(0, len(items), per))
    return len(cloudpickle.dumps(task)), data


def measure(classes: int) -> dict[str, Any]:
    """One size: build and publish the manifest of CLASSES classes, read it back as the next run does."""
    from imgest.core.quarantine import QuarantineLog
    from imgest.sinks.shards import pack_publish
    from imgest.sinks.shards.pack_record import PackConfig
    from imgest.sinks.shards.plan import ShardSpec
    from imgest.sinks.shards.store import LocalStore, manifest_bytes
    from imgest.sources.manifest import ClassInfo
    from imgest.transform.image import TransformSpec

    records = _records(classes)
    cfg = PackConfig("/data", "bench", "/tmp/x", TransformSpec(), ShardSpec(PER_SHARD), key="k" * 64)
    infos = [ClassInfo(i, f"n{i:08d}") for i in range(classes)]
    with tempfile.TemporaryDirectory() as tmp:
        store = LocalStore(Path(tmp))
        t0 = time.monotonic()
        manifest = pack_publish.build_manifest(records, cfg, infos, QuarantineLog())
        try:
            from imgest.sinks.shards.shard_table import shards_table
        except ImportError:  # before this change: no table, the detail is in manifest.json
            shards_table = None
        extra = shards_table(records) if shards_table is not None else None
        pack_publish.publish(store, manifest, b"", *([extra] if extra is not None else []))
        built = time.monotonic() - t0
        t0 = time.monotonic()
        if "published" in {f.name for f in dataclasses.fields(PackConfig)}:  # before: in the config
            cfg = dataclasses.replace(cfg, published=pack_publish.published_entries(store))
        else:
            pack_publish.published_entries(store.read_manifest())
        read = time.monotonic() - t0
        task, data = _task_bytes(cfg, store)
        return {
            "classes": classes,
            "shards": len(records),
            "manifest_json_bytes": len(manifest_bytes(manifest)),
            "shards_table_bytes": len(extra) if extra is not None else None,
            "pack_config_pickle_bytes": len(pickle.dumps(cfg)),
            "task_function_pickle_bytes": task,
            "largest_task_data_bytes": data,
            "build_publish_s": round(built, 2),
            "driver_read_s": round(read, 2),
        }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--classes", type=int, nargs="+", default=[1_000, 21_841])
    for classes in p.parse_args().classes:
        print(json.dumps(measure(classes)), flush=True)


if __name__ == "__main__":
    main()
