"""A generated dataset already in the files target's published layout (imgest.sinks.files.layout), no Spark.

For checks and benchmarks of readers of the files target (``imgest validate xnvme``) on a machine without an
ingested dataset: the same arguments always give byte-identical images.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np

from imgest.core import workdir
from imgest.sinks.files.layout import SAMPLES_COLUMNS, file_path, staging_dir
from imgest.sources.devdata.images import jpeg_bytes
from imgest.sources.devdata.sample import synsets

log = logging.getLogger(__name__)


def write_files_dataset(
    out: Path, classes: int = 10, per_class: int = 20, val_per_class: int = 5, seed: int = 0, large_every: int = 40
) -> dict[str, int]:
    """Write the version folder ``OUT/v/<key>/`` (``<split>/<wnid>/<id>.jpg``, ``samples.parquet``, its
    ``manifest.json``) and, last, ``OUT/manifest.json`` naming it; returns counts. The key derives from the
    arguments, so the same arguments publish the same folder again."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from imgest.sinks.files.write import manifest_bytes, publish

    args = f"{classes}/{per_class}/{val_per_class}/{seed}/{large_every}"
    key = f"devdata-{hashlib.sha256(args.encode()).hexdigest()[:12]}"
    folder = staging_dir(out, key)
    rows: list[dict[str, object]] = []
    wnids = [wnid for wnid, _ in synsets(classes)]
    for split, count in (("train", per_class), ("val", val_per_class)):
        for label, wnid in enumerate(wnids):
            hue = np.random.default_rng([seed, 7, label]).random(3)
            for n in range(count):
                rng = np.random.default_rng([seed, 0 if split == "train" else 1, label, n])
                large = large_every > 0 and (label * count + n) % large_every == large_every - 1
                data = jpeg_bytes(rng, hue, large)
                image_id = hashlib.sha1(f"{seed}/{split}/{wnid}/{n}".encode()).hexdigest()[:16]
                rel = file_path(split, wnid, image_id, "jpg")
                (folder / rel).parent.mkdir(parents=True, exist_ok=True)
                (folder / rel).write_bytes(data)
                sha = hashlib.sha256(data).hexdigest()
                rows.append(
                    {
                        "id": image_id,
                        "path": rel,
                        "label": label,
                        "split": split,
                        "wnid": wnid,
                        "bytes": len(data),
                        "sha256": sha,
                    }
                )
    table = pa.Table.from_pylist(rows).select(list(SAMPLES_COLUMNS)).sort_by("path")
    pq.write_table(table, folder / workdir.PUBLISHED_SAMPLES)
    counts = {split: sum(1 for r in rows if r["split"] == split) for split in ("train", "val")}
    manifest = {
        "format": "files",
        "dataset": out.name,
        "version": f"devdata-{seed}",
        "samples": counts,
        "classes": wnids,
        "bytes": sum(int(r["bytes"]) for r in rows),  # type: ignore[call-overload]
    }
    (folder / workdir.PUBLISHED_MANIFEST).write_bytes(manifest_bytes(manifest))
    publish(out, key, manifest)
    log.info("files dataset written to %s: %s", out, counts)
    return counts
