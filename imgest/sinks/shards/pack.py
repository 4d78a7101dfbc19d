"""Packing shards: build one shard from its planned rows, stage it, and publish the dataset at the end."""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from imgest.core import workdir
from imgest.core.quarantine import QuarantineLog, quarantine_summary
from imgest.core.scratch import scratch_dir
from imgest.sinks.shards.plan import ShardSpec, shard_digest
from imgest.sinks.shards.store import ShardStore
from imgest.sinks.shards.tar_writer import ShardTarWriter
from imgest.sources.manifest import Candidate, ClassInfo
from imgest.transform.image import TransformSpec
from imgest.transform.pipeline import process_candidates

log = logging.getLogger(__name__)
CANDIDATE_FIELDS = ("id", "split", "rel_path", "wnid", "label", "size", "mtime", "container", "offset")


@dataclass(frozen=True)
class PackConfig:
    """What every shard task needs (no secrets: S3 keys come from the executor's environment)."""

    root: str
    dataset: str
    dest: str
    spec: TransformSpec
    shards: ShardSpec
    published: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> entry of the live manifest.json


@dataclass
class ShardRecord:
    """One shard as it appears in manifest.json, plus what happened while building it."""

    name: str
    split: str
    samples: int
    bytes: int
    sha256: str
    digest: str
    index: str
    reused: str = ""  # "", "staged" (interrupted run) or "published" (already live)
    labels: dict[str, int] = field(default_factory=dict)
    quarantine: list[dict[str, Any]] = field(default_factory=list)


def sample_members(cand: Candidate, data: bytes, ext: str, width: int, height: int) -> list[tuple[str, bytes]]:
    """The webdataset members of one sample: image, .cls (label), .json (deterministic)."""
    meta = {
        "id": cand.id,
        "label": cand.label,
        "wnid": cand.wnid,
        "split": cand.split,
        "source": cand.rel_path,
        "width": width,
        "height": height,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),  # read-back checks hash what they read against this
    }
    return [(ext, data), ("cls", str(cand.label).encode()), ("json", json.dumps(meta, sort_keys=True).encode())]


def sample_key(cand: Candidate) -> str:
    """Unique, separator-free key: the image id (a UUID)."""
    return cand.id


def reused_shard(name: str, digest: str, split: str, cfg: PackConfig, store: ShardStore) -> ShardRecord | None:
    """The record of shard NAME when it is already published or staged with the same inputs, else None."""
    live = cfg.published.get(name)
    if live is not None and live.get("digest") == digest:
        log.info("shard %s is already published with the same inputs; kept", name)
        return ShardRecord(
            name,
            split,
            live["samples"],
            live["bytes"],
            live["sha256"],
            digest,
            live["index"],
            reused="published",
            labels=live.get("labels", {}),
            quarantine=live.get("quarantine", []),
        )
    staged = store.staged(name)
    info = staged_info(name, digest, store) if staged is not None and staged.get("digest") == digest else None
    if staged is not None and info is not None:
        log.info("shard %s is already staged with the same inputs; skipped", name)
        return ShardRecord(
            name,
            split,
            int(staged["samples"]),
            int(staged["bytes"]),
            staged["sha256"],
            digest,
            index=workdir.shard_index(name),
            reused="staged",
            labels=info["labels"],
            quarantine=info["quarantine"],
        )
    return None


def staged_info(name: str, digest: str, store: ShardStore) -> dict[str, Any] | None:
    """The staged sidecar of shard NAME (labels, quarantine) when it was written for DIGEST, else None."""
    raw = store.read_staged(workdir.shard_info(name))
    if raw is None:
        return None
    info = json.loads(raw)
    return info if info.get("digest") == digest else None


def pack_shard(
    name: str,
    rows: list[dict[str, Any]],
    cfg: PackConfig,
    store: ShardStore,
    on_sample: Callable[[int], None] | None = None,
) -> ShardRecord:
    """Build shard NAME from ROWS (in planned order) unless it is already staged with the same inputs."""
    digest = shard_digest(rows, cfg.spec)
    split = rows[0]["split"]
    reused = reused_shard(name, digest, split, cfg, store)
    if reused is not None:
        return reused
    quarantine = QuarantineLog()
    labels: Counter[str] = Counter()
    candidates = [Candidate(**{k: r[k] for k in CANDIDATE_FIELDS}) for r in rows]
    with scratch_dir() as tmp:
        path = Path(tmp) / name
        with ShardTarWriter(path) as writer:
            for item in process_candidates(candidates, Path(cfg.root), cfg.spec, quarantine):
                img = item.image
                writer.add(
                    sample_key(item.candidate), sample_members(item.candidate, img.data, img.ext, img.width, img.height)
                )
                labels[str(item.candidate.label)] += 1
                if on_sample:
                    on_sample(len(img.data))
        shard = writer.result
        assert shard is not None
        bad = [{**asdict(e), "reason": str(e.reason)} for e in quarantine.entries]
        for side, body in (
            (workdir.shard_index(name), shard.index.encode()),
            (workdir.shard_info(name), info_bytes(digest, labels, bad)),
        ):
            (Path(tmp) / side).write_bytes(body)
            side_meta = {"digest": digest, "bytes": str(len(body)), "samples": "0", "sha256": ""}
            store.stage(Path(tmp) / side, side, side_meta)
        # Object metadata stays small and bounded (S3 allows 2 KB): fixed-size fields only; labels and quarantine
        # are in the sidecar above and in manifest.json. The shard last: its presence means the sidecars are there.
        meta = {"digest": digest, "sha256": shard.sha256, "bytes": str(shard.nbytes), "samples": str(shard.samples)}
        store.stage(shard.path, name, meta)
    return ShardRecord(
        name,
        split,
        shard.samples,
        shard.nbytes,
        shard.sha256,
        digest,
        workdir.shard_index(name),
        labels=dict(labels),
        quarantine=bad,
    )


def info_bytes(digest: str, labels: Counter[str], quarantine: list[dict[str, Any]]) -> bytes:
    """The sidecar of a shard: its input digest, samples per label and quarantined inputs (deterministic)."""
    info = {"digest": digest, "labels": dict(labels), "quarantine": quarantine}
    return json.dumps(info, sort_keys=True).encode()


def pack_shards(
    groups: Iterable[tuple[str, list[dict[str, Any]]]],
    cfg: PackConfig,
    store_factory: Callable[[], ShardStore],
    on_sample: Callable[[int], None] | None = None,
) -> list[ShardRecord]:
    """pack_shard for each (name, rows) group of one Spark partition."""
    store = store_factory()
    return [pack_shard(name, rows, cfg, store, on_sample) for name, rows in groups]


def build_manifest(
    records: list[ShardRecord], cfg: PackConfig, classes: list[ClassInfo], scan_quarantine: QuarantineLog
) -> dict[str, Any]:
    """manifest.json: shards, counts, class map, quarantine summary, settings (no timestamps: re-runs match)."""
    records = sorted(records, key=lambda r: r.name)
    quarantine = [q for r in records for q in r.quarantine] + [
        {**asdict(e), "reason": str(e.reason)} for e in scan_quarantine.entries
    ]
    per_split: Counter[str] = Counter()
    for r in records:
        per_split[r.split] += r.samples
    return {
        "format": "webdataset",
        "dataset": cfg.dataset,
        "members": ["jpg|<ext> (image)", "cls (label, ASCII)", "json (id, label, wnid, split, source, size)"],
        "shards": [
            {
                "name": r.name,
                "split": r.split,
                "samples": r.samples,
                "bytes": r.bytes,
                "sha256": r.sha256,
                "index": r.index,
                "info": workdir.shard_info(r.name),
                "digest": r.digest,
                "labels": r.labels,
                "quarantine": r.quarantine,
            }
            for r in records
        ],
        "samples": dict(sorted(per_split.items())),
        "bytes": sum(r.bytes for r in records),
        "classes": [asdict(c) for c in classes],
        "quarantine": quarantine_summary(quarantine),
        "transform": cfg.spec.as_dict(),
        "sharding": asdict(cfg.shards),
    }


def samples_table(plan: Any, records: list[ShardRecord]) -> bytes:
    """samples.parquet: id, label, split, shard and position of every packed sample (vectorised; PLAN is in
    shard order, quarantined samples are left out)."""
    import io

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    dropped = pa.array(sorted({q["id"] for r in records for q in r.quarantine}), pa.string())
    kept = plan.filter(pc.invert(pc.is_in(plan.column("id"), value_set=dropped))).select(
        ["id", "label", "split", "shard"]
    )
    codes = pc.dictionary_encode(kept.column("shard")).combine_chunks().indices.to_numpy()
    rows = np.arange(len(codes))
    starts = np.maximum.accumulate(np.where(np.r_[True, codes[1:] != codes[:-1]], rows, 0)) if len(codes) else rows
    table = kept.append_column("position", pa.array(rows - starts, pa.int32()))
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def publish(
    store: ShardStore, records: list[ShardRecord], manifest: dict[str, Any], samples: bytes | None = None
) -> bool:
    """Withdraw the old manifest, move new shards out of staging, write samples.parquet, the manifest last.

    Returns False, touching nothing, when every shard was already live and the manifest is unchanged.
    """
    live = store.read_manifest()
    fresh = [r for r in sorted(records, key=lambda r: r.name) if r.reused != "published"]
    if live == manifest and not fresh:
        return False
    if live is not None:
        store.withdraw_manifest()
    store.publish([n for r in fresh for n in (r.index, workdir.shard_info(r.name), r.name)])
    if samples is not None:
        store.put_bytes(workdir.PUBLISHED_SAMPLES, samples)
    store.write_manifest(manifest)
    return True


def published_entries(store: ShardStore) -> dict[str, dict[str, Any]]:
    """name -> manifest entry of the shards the live manifest.json lists (empty when none is live)."""
    live = store.read_manifest() or {}
    return {entry["name"]: entry for entry in live.get("shards", []) if "digest" in entry}
