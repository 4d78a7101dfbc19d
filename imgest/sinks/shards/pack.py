"""Packing shards: build one shard from its planned rows and write it under the run's versioned prefix, or keep
the published one with the same inputs (imgest.sinks.shards.pack_publish publishes the dataset at the end)."""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from imgest.core import workdir
from imgest.core.quarantine import QuarantineLog
from imgest.core.scratch import scratch_dir
from imgest.core.staging import Staged
from imgest.sinks.shards.pack_keep import kept_with_deletions
from imgest.sinks.shards.pack_record import PackConfig, Published, ShardRecord
from imgest.sinks.shards.plan import DEAD, read_shard_table
from imgest.sinks.shards.plan_digest import shard_digest, shard_table_digest
from imgest.sinks.shards.shard_table import dead_count
from imgest.sinks.shards.store import ShardStore
from imgest.sinks.shards.store_names import shard_object
from imgest.sinks.shards.tar_writer import ShardTarWriter
from imgest.sources.manifest import Candidate
from imgest.transform.pipeline import process_candidates

log = logging.getLogger(__name__)
CANDIDATE_FIELDS = ("id", "split", "rel_path", "wnid", "label", "size", "mtime", "container", "offset")
KEEP_COLUMNS = ["id", "split", "size", "mtime", "label", DEAD]  # what keep_published reads of a shard's plan rows


def sample_members(
    cand: Candidate, data: bytes, ext: str, width: int, height: int, sha256: str | None = None
) -> list[tuple[str, bytes]]:
    """The webdataset members of one sample: image, .cls (label), .json (deterministic).

    SHA256 is DATA's digest when the caller already has it (UNCHANGED mode stores the source bytes, whose
    digest the pipeline computed on reading); otherwise it is computed here.
    """
    meta = {
        "id": cand.id,
        "label": cand.label,
        "wnid": cand.wnid,
        "split": cand.split,
        "source": cand.rel_path,
        "width": width,
        "height": height,
        "size": len(data),
        "sha256": sha256 or hashlib.sha256(data).hexdigest(),  # read-back checks hash what they read against this
    }
    return [(ext, data), ("cls", str(cand.label).encode()), ("json", json.dumps(meta, sort_keys=True).encode())]


def sample_key(cand: Candidate) -> str:
    """Unique, separator-free key: the image id (a UUID)."""
    return cand.id


def reused_shard(
    name: str, digest: str, split: str, cfg: PackConfig, store: ShardStore, live: Published = None
) -> ShardRecord | None:
    """The record of shard NAME when it is already published as LIVE (its object still there, same size; the
    record's labels and quarantine are then carried from the live version by the driver) or written under this
    run's prefix with the same inputs, else None."""
    if live is not None and live.get("digest") == digest and not dead_count(live):
        path = shard_object(live)
        if store.size(path) == live["bytes"]:
            log.info("shard %s is already published as %s with the same inputs; kept", name, path)
            return ShardRecord(
                name,
                split,
                live["samples"],
                live["bytes"],
                live["sha256"],
                digest,
                path,
                live["index"],
                live.get("info") or workdir.shard_info(path),
                reused="published",
                carried=True,
            )
        log.warning("shard %s: the live manifest lists %s but it is missing or truncated; writing it again", name, path)
    path = f"{cfg.prefix()}/{name}"
    meta = store.written(path)
    info = written_info(path, digest, store) if meta is not None and meta.get("digest") == digest else None
    if meta is not None and info is not None:
        log.info("shard %s is already written as %s with the same inputs; skipped", name, path)
        return ShardRecord(
            name,
            split,
            int(meta["samples"]),
            int(meta["bytes"]),
            meta["sha256"],
            digest,
            path,
            workdir.shard_index(path),
            workdir.shard_info(path),
            reused="resumed",
            labels=info["labels"],
            quarantine=info["quarantine"],
        )
    return None


def written_info(path: str, digest: str, store: ShardStore) -> dict[str, Any] | None:
    """The sidecar of the shard at PATH (labels, quarantine) when it was written for DIGEST, else None."""
    raw = store.read_bytes(workdir.shard_info(path))
    if raw is None:
        return None
    info = json.loads(raw)
    return info if info.get("digest") == digest else None


Sample = tuple[Candidate, bytes, str, int, int, str | None]  # candidate, stored bytes, ext, width, height, sha256


def pack_shard(
    name: str,
    rows: list[dict[str, Any]],
    cfg: PackConfig,
    store: ShardStore,
    on_sample: Callable[[int], None] | None = None,
    live: Published = None,
) -> ShardRecord:
    """Build shard NAME from ROWS (in planned order) and write it to ``v/<key>/NAME`` unless it is already
    published (as LIVE) or written there with the same inputs (settle_shard)."""
    settled = settle_shard(name, rows, cfg, store, live)
    if isinstance(settled, ShardRecord):
        return settled
    rows, digest = settled
    return write_shard(name, rows, digest, cfg, store, on_sample)


def settle_shard(
    name: str, rows: list[dict[str, Any]], cfg: PackConfig, store: ShardStore, live: Published = None
) -> ShardRecord | tuple[list[dict[str, Any]], str]:
    """The record of shard NAME when no sample of it needs writing (published as LIVE, or written under this run's
    prefix with the same inputs), else (the ROWS to write, their digest). ROWS with dead ones (a refresh's kept
    shard, see replan) keep the published tar with a new index of its live samples (kept_with_deletions); when that
    tar is not there with the same inputs, its live rows are to be written as a new tar."""
    planned = len(rows)
    if any(r.get(DEAD) for r in rows):
        kept = kept_with_deletions(name, _table(rows), cfg, store, live)
        if kept is not None:
            return kept
        rows = [r for r in rows if not r.get(DEAD)]  # its live rows, packed (or kept) as a shard of their own
    digest = shard_digest(rows, cfg.spec)
    reused = reused_shard(name, digest, rows[0]["split"], cfg, store, live)
    if reused is not None:
        return reused
    if len(rows) < planned:
        log.warning("shard %s: no published tar with the same inputs to keep; its live samples are rewritten", name)
    return rows, digest


def candidate(row: dict[str, Any]) -> Candidate:
    """The candidate of a plan row."""
    return Candidate(**{k: row[k] for k in CANDIDATE_FIELDS})


def write_shard(
    name: str,
    rows: list[dict[str, Any]],
    digest: str,
    cfg: PackConfig,
    store: ShardStore,
    on_sample: Callable[[int], None] | None = None,
) -> ShardRecord:
    """Transform ROWS, in their order, into the shard NAME (store_shard)."""
    quarantine = QuarantineLog()
    keeps_source = cfg.spec.mode == "unchanged"  # stored bytes are the source bytes: hash them once
    processed = process_candidates([candidate(r) for r in rows], Path(cfg.root), cfg.spec, quarantine)
    samples: Iterable[Sample] = (
        (p.candidate, p.image.data, p.image.ext, p.image.width, p.image.height, p.src_sha256 if keeps_source else None)
        for p in processed
    )
    return store_shard(name, rows[0]["split"], digest, samples, quarantine, cfg, store, on_sample)


def store_shard(
    name: str,
    split: str,
    digest: str,
    samples: Iterable[Sample],
    quarantine: QuarantineLog,
    cfg: PackConfig,
    store: ShardStore,
    on_sample: Callable[[int], None] | None = None,
) -> ShardRecord:
    """Write SAMPLES (in shard order) into the tar NAME with its DALI index and info sidecars (the shard last: its
    presence means the sidecars are there), at ``v/<key>/NAME`` with DIGEST in the objects' metadata. QUARANTINE
    holds the shard's quarantined inputs once SAMPLES is consumed."""
    path = f"{cfg.prefix()}/{name}"
    labels: Counter[str] = Counter()
    with scratch_dir() as tmp:
        with ShardTarWriter(Path(tmp) / name) as writer:
            for cand, data, ext, width, height, sha256 in samples:
                writer.add(sample_key(cand), sample_members(cand, data, ext, width, height, sha256))
                labels[str(cand.label)] += 1
                if on_sample:
                    on_sample(len(data))
        shard = writer.result
        assert shard is not None
        bad = [{**asdict(e), "reason": str(e.reason)} for e in quarantine.entries]
        for side, body in (
            (workdir.shard_index(path), shard.index.encode()),
            (workdir.shard_info(path), info_bytes(digest, labels, bad)),
        ):
            (Path(tmp) / "side").write_bytes(body)
            side_meta = {"digest": digest, "bytes": str(len(body)), "samples": "0", "sha256": ""}
            store.put_file(Path(tmp) / "side", side, side_meta)
        # Object metadata stays small and bounded (S3 allows 2 KB): fixed-size fields only; labels and quarantine
        # are in the sidecar above and in manifest.json. The shard last: its presence means the sidecars are there.
        meta = {"digest": digest, "sha256": shard.sha256, "bytes": str(shard.nbytes), "samples": str(shard.samples)}
        store.put_file(shard.path, path, meta)
    return ShardRecord(
        name,
        split,
        shard.samples,
        shard.nbytes,
        shard.sha256,
        digest,
        path,
        workdir.shard_index(path),
        workdir.shard_info(path),
        labels=dict(labels),
        quarantine=bad,
    )


def _table(rows: list[dict[str, Any]]) -> Any:
    """ROWS (plan rows as dicts) as an Arrow table of KEEP_COLUMNS."""
    import pyarrow as pa

    return pa.table({c: [r.get(c) for r in rows] for c in KEEP_COLUMNS})


def keep_published(name: str, rows: Any, cfg: PackConfig, store: ShardStore, live: Published) -> ShardRecord | None:
    """The record of shard NAME when its published tar (LIVE) serves the planned ROWS as it is (an Arrow table with at
    least KEEP_COLUMNS but the dead flag): the same inputs and no dead row (reused_shard), or dead rows
    (kept_with_deletions); None when pack_shard must handle it (a new or changed shard, or one written under this
    run's prefix). Reads the rows as columns, so a refresh that keeps most shards costs no Python object per row."""
    import pyarrow.compute as pc

    if live is None or not rows.num_rows:
        return None
    if DEAD in rows.column_names and pc.any(rows.column(DEAD)).as_py():
        return kept_with_deletions(name, rows, cfg, store, live)
    digest = shard_table_digest(rows, cfg.spec)
    if live.get("digest") != digest or dead_count(live):
        return None
    return reused_shard(name, digest, str(rows.column("split")[0].as_py()), cfg, store, live)


def pack_planned(
    plan: Path | Staged,
    shards: Iterable[tuple[str, int, Published]],
    cfg: PackConfig,
    store_factory: Callable[[], ShardStore],
    on_sample: Callable[[int], None] | None = None,
) -> list[ShardRecord]:
    """The records of SHARDS ((name, row group of the plan file PLAN, live entry or None) of one Spark partition:
    a shard kept as published is decided from its rows' columns (keep_published), any other is packed from its rows
    (pack_shard)."""
    import pyarrow.parquet as pq

    store = store_factory()
    source = plan.parquet() if isinstance(plan, Staged) else pq.ParquetFile(plan)
    records = []
    for name, group, live in shards:
        record = keep_published(name, read_shard_table(source, group, KEEP_COLUMNS), cfg, store, live)
        if record is None:
            record = pack_shard(name, read_shard_table(source, group).to_pylist(), cfg, store, on_sample, live)
        records.append(record)
    return records


def info_bytes(digest: str, labels: Counter[str], quarantine: list[dict[str, Any]]) -> bytes:
    """The sidecar of a shard: its input digest, samples per label and quarantined inputs (deterministic)."""
    info = {"digest": digest, "labels": dict(labels), "quarantine": quarantine}
    return json.dumps(info, sort_keys=True).encode()
