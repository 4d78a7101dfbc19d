"""A published files dataset of random bytes (no JPEG encoding): fast to write at any size, for the xNVMe check."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np


def write_random_files(
    root: Path, classes: int, per_class: int, nbytes: int, val_per_class: int = 0, seed: int = 0
) -> dict[str, int]:
    """``ROOT/<split>/<wnid>/<id>.jpg`` of NBYTES random bytes each, samples.parquet and, last, manifest.json;
    returns the rows per split. Class I of train holds PER_CLASS + I files, so classes differ in size."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    rows: dict[str, list] = {k: [] for k in ("id", "path", "label", "split", "wnid", "bytes", "sha256")}
    for split, count in (("train", per_class), ("val", val_per_class)):
        for label in range(classes if count else 0):
            wnid = f"n{label:08d}"
            (root / split / wnid).mkdir(parents=True, exist_ok=True)
            for n in range(count + (label if split == "train" else 0)):
                data = rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes()
                image_id = f"{split}{label:04d}{n:06d}"
                rel = f"{split}/{wnid}/{image_id}.jpg"
                (root / rel).write_bytes(data)
                for key, value in zip(
                    rows, (image_id, rel, label, split, wnid, len(data), hashlib.sha256(data).hexdigest()), strict=True
                ):
                    rows[key].append(value)
    pq.write_table(pa.table(rows), root / "samples.parquet")
    counts = {s: rows["split"].count(s) for s in ("train", "val") if s in rows["split"]}
    manifest = {"format": "files", "dataset": root.name, "version": "random", "samples": counts}
    (root / "manifest.json").write_text(json.dumps(manifest) + "\n")
    return counts
