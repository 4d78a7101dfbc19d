"""A shard's worth of rows over many classes with many quarantined inputs (S3 metadata limits)."""

from __future__ import annotations

import io
import uuid
from pathlib import Path
from typing import Any

from PIL import Image


def wide_shard_rows(root: Path, classes: int = 1000, bad: int = 400) -> list[dict[str, Any]]:
    """One tiny JPEG per class (labels 0..CLASSES-1) and BAD empty files: rows of one shard, in plan form."""
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (90, 120, 150)).save(buf, "JPEG", quality=80)
    rows: list[dict[str, Any]] = []
    for i in range(classes + bad):
        label = i % classes
        wnid = f"n{label:08d}"
        rel = f"train/{wnid}/{'bad' if i >= classes else 'img'}_{i:05d}.JPEG"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"" if i >= classes else buf.getvalue())
        rows.append(
            {
                "id": str(uuid.uuid5(uuid.NAMESPACE_URL, rel)),
                "split": "train",
                "rel_path": rel,
                "wnid": wnid,
                "label": label,
                "size": path.stat().st_size,
                "mtime": path.stat().st_mtime,
                "container": "",
                "offset": -1,
                "shard": "train-000000.tar",
            }
        )
    return rows


def pack_in_process(
    manifest: Path,
    store: Any,
    spec: Any,
    shards: Any,
    only: int | None = None,
    publish_it: bool = True,
) -> tuple[Any, list[Any], dict[str, Any]]:
    """What the pack job does, in one process: plan, version key, the first ONLY shards (all by default), manifest,
    publish (with its samples table). Returns (PackConfig, records, manifest)."""
    from imgest.core.quarantine import QuarantineLog
    from imgest.sinks.shards.pack import pack_shard
    from imgest.sinks.shards.pack_publish import (
        build_manifest,
        carry_published,
        publish,
        published_entries,
        samples_table,
    )
    from imgest.sinks.shards.pack_record import PackConfig
    from imgest.sinks.shards.plan import plan_shards
    from imgest.sinks.shards.plan_digest import version_key
    from imgest.sinks.shards.shard_table import shards_table
    from imgest.sources.manifest import manifest_metadata, read_classes

    table = plan_shards(manifest / "manifest.parquet", shards, spec)
    root = manifest_metadata(manifest / "manifest.parquet")["root"]
    cfg = PackConfig(root, "vs", store.location, spec, shards, key=version_key(table, spec))
    live = store.read_manifest()
    published = published_entries(live)
    plan = table.to_pylist()
    names = sorted({r["shard"] for r in plan})[:only]
    records = [pack_shard(n, [r for r in plan if r["shard"] == n], cfg, store, live=published.get(n)) for n in names]
    carry_published(records, live, store)
    doc = build_manifest(records, cfg, read_classes(manifest / "classes.json"), QuarantineLog())
    if publish_it:
        publish(store, doc, samples_table(table, records), shards_table(records))
    return cfg, records, doc
