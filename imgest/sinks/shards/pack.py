"""Packing shards: build one shard from its planned rows and write it under the run's versioned prefix, or keep
the published one with the same inputs (imgest.sinks.shards.pack_publish publishes the dataset at the end)."""

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
from imgest.core.errors import ConfigError
from imgest.core.quarantine import QuarantineLog
from imgest.core.scratch import scratch_dir
from imgest.core.settings import S3Settings
from imgest.core.staging import Staged
from imgest.sinks.shards.plan import DEAD, ShardSpec, read_shard_table
from imgest.sinks.shards.plan_digest import shard_digest, shard_table_digest
from imgest.sinks.shards.shard_table import DEAD_COUNT, dead_count
from imgest.sinks.shards.store import ShardStore
from imgest.sinks.shards.store_names import shard_object, version_prefix
from imgest.sinks.shards.tar_writer import INDEX_VERSION, ShardTarWriter, index_key
from imgest.sources.manifest import Candidate
from imgest.transform.image import TransformSpec
from imgest.transform.pipeline import process_candidates

log = logging.getLogger(__name__)
CANDIDATE_FIELDS = ("id", "split", "rel_path", "wnid", "label", "size", "mtime", "container", "offset")
KEEP_COLUMNS = ["id", "split", "size", "mtime", "label", DEAD]  # what keep_published reads of a shard's plan rows
# What a task needs of a shard's live manifest entry to keep it (its labels, quarantine and dead keys only travel
# with the shards a refresh marks dead rows in: see pack_publish.plan_items).
PUBLISHED_FIELDS = ("name", "split", "samples", "bytes", "sha256", "digest", "path", "index", "info", DEAD_COUNT)
Published = dict[str, Any] | None  # a shard's live entry (PUBLISHED_FIELDS), or None when none is live


@dataclass(frozen=True)
class PackConfig:
    """What every shard task needs. S3 (endpoint, keys) is resolved once by the driver and travels inside the
    pickled task, never in Spark conf, argv or the executors' environment (its repr hides the keys). The live
    manifest's entries are not here: each shard travels with its own (pack_publish.plan_items)."""

    root: str
    dataset: str
    dest: str
    spec: TransformSpec
    shards: ShardSpec
    s3: S3Settings | None = None  # None: a local folder, or the executor's environment
    key: str = ""  # plan.version_key of the run's plan: new shards go under v/<key>/

    def prefix(self) -> str:
        """Where this run's new objects go, relative to the destination: ``v/<key>``."""
        if not self.key:
            raise ConfigError(
                f"no version key for the shards of {self.dataset} at {self.dest}: "
                "set PackConfig.key to plan.version_key(plan, spec)"
            )
        return version_prefix(self.key)


@dataclass
class ShardRecord:
    """One shard as it appears in manifest.json, plus what happened while building it. NAME is the shard's name
    in the plan and samples.parquet; PATH, INDEX and INFO are its objects, relative to the destination."""

    name: str
    split: str
    samples: int
    bytes: int
    sha256: str
    digest: str
    path: str
    index: str
    info: str
    reused: str = ""  # "", "resumed" (written by an interrupted run) or "published" (already live)
    labels: dict[str, int] = field(default_factory=dict)
    quarantine: list[dict[str, Any]] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)  # keys of the tar's samples that are no longer live (sorted)
    carried: bool = False  # labels, quarantine and dead are the live version's: the driver fills them in


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


def pack_shard(
    name: str,
    rows: list[dict[str, Any]],
    cfg: PackConfig,
    store: ShardStore,
    on_sample: Callable[[int], None] | None = None,
    live: Published = None,
) -> ShardRecord:
    """Build shard NAME from ROWS (in planned order) and write it to ``v/<key>/NAME`` unless it is already
    published (as LIVE) or written there with the same inputs. ROWS with dead ones (a refresh's kept shard, see
    replan) keep the published tar with a new index of its live samples (kept_with_deletions); when that tar is not
    there with the same inputs, the live rows are written to a new tar."""
    planned = len(rows)
    if any(r.get(DEAD) for r in rows):
        kept = kept_with_deletions(name, _table(rows), cfg, store, live)
        if kept is not None:
            return kept
        rows = [r for r in rows if not r.get(DEAD)]  # its live rows, packed (or kept) as a shard of their own
    digest = shard_digest(rows, cfg.spec)
    split = rows[0]["split"]
    reused = reused_shard(name, digest, split, cfg, store, live)
    if reused is not None:
        return reused
    if len(rows) < planned:
        log.warning("shard %s: no published tar with the same inputs to keep; its live samples are rewritten", name)
    return write_shard(name, rows, digest, cfg, store, on_sample)


def write_shard(
    name: str,
    rows: list[dict[str, Any]],
    digest: str,
    cfg: PackConfig,
    store: ShardStore,
    on_sample: Callable[[int], None] | None = None,
) -> ShardRecord:
    """Transform ROWS into the tar NAME with its DALI index and info sidecars (the shard last: its presence means
    the sidecars are there), written to ``v/<key>/NAME`` with DIGEST in the objects' metadata."""
    split = rows[0]["split"]
    path = f"{cfg.prefix()}/{name}"
    quarantine = QuarantineLog()
    labels: Counter[str] = Counter()
    candidates = [Candidate(**{k: r[k] for k in CANDIDATE_FIELDS}) for r in rows]
    keeps_source = cfg.spec.mode == "unchanged"  # stored bytes are the source bytes: hash them once
    with scratch_dir() as tmp:
        local = Path(tmp) / name
        with ShardTarWriter(local) as writer:
            for item in process_candidates(candidates, Path(cfg.root), cfg.spec, quarantine):
                img, known = item.image, item.src_sha256 if keeps_source else None
                members = sample_members(item.candidate, img.data, img.ext, img.width, img.height, known)
                writer.add(sample_key(item.candidate), members)
                labels[str(item.candidate.label)] += 1
                if on_sample:
                    on_sample(len(img.data))
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


def kept_with_deletions(
    name: str, rows: Any, cfg: PackConfig, store: ShardStore, live: Published
) -> ShardRecord | None:
    """The record of shard NAME kept as published with the dead ROWS taken out, or None when LIVE (its live entry
    with its labels, quarantine and dead keys) is no tar of NAME with the same inputs (every row, dead or live, in
    its order). No byte of the tar is rewritten: its live samples are listed in a new DALI index
    ``v/<key>/NAME.idx`` (never the published index's name), its dead keys in the record. A shard with no new dead
    sample keeps its published entry: its index is neither read nor written, so a refresh costs nothing for the
    shards an earlier one marked."""
    import pyarrow as pa
    import pyarrow.compute as pc

    digest = shard_table_digest(rows, cfg.spec)
    if live is None or live.get("digest") != digest or store.size(shard_object(live)) != live["bytes"]:
        return None
    _require_detail(name, live)
    flags = pc.fill_null(rows.column(DEAD), False)
    dead = {str(i) for i in pc.filter(rows.column("id"), flags).to_pylist()}
    record = ShardRecord(
        name,
        str(rows.column("split")[0].as_py()),
        live["samples"],
        live["bytes"],
        live["sha256"],
        digest,
        shard_object(live),
        str(live["index"]),
        live.get("info") or workdir.shard_info(shard_object(live)),
        reused="published",
        labels=live.get("labels", {}),
        quarantine=[q for q in live.get("quarantine", []) if q.get("id") not in dead],
        dead=list(live.get("dead", [])),
    )
    if not dead - set(record.dead):  # no new dead sample: the published entry stays right, nothing is read
        return record
    raw = store.read_bytes(record.index)
    if raw is None:
        log.warning("shard %s: its index %s is missing", name, record.index)
        return None
    cut = _index_lines(raw, dead - set(record.dead), record.index)  # the samples dead since, found by key
    if not cut:  # the new dead rows were never in the tar (quarantined)
        return record
    header, _, body = raw.partition(b"\n")
    pieces, at = [], 0
    for start, end in sorted(cut.values()):
        pieces.append(body[at:start])
        at = end
    pieces.append(body[at:])
    record.samples = int(header.split()[1]) - len(cut)
    record.index = workdir.shard_index(f"{cfg.prefix()}/{name}")
    store.put_bytes(record.index, b"".join([f"{INDEX_VERSION} {record.samples}\n".encode(), *pieces]))
    dead_keys = sorted(set(record.dead) | set(cut))
    record.dead = dead_keys
    absent = pa.array(sorted({str(q.get("id")) for q in record.quarantine}), pa.string())  # live, never in the tar
    counted = pc.and_(pc.invert(flags), pc.invert(pc.is_in(rows.column("id"), value_set=absent)))
    counts = pc.value_counts(pc.filter(rows.column("label"), counted)).to_pylist()
    record.labels = {str(c["values"]): int(c["counts"]) for c in counts}
    log.info("shard %s: kept as %s, %d samples dead, indexed by %s", name, record.path, len(dead_keys), record.index)
    return record


def _require_detail(name: str, live: dict[str, Any]) -> None:
    """Refuse to keep shard NAME with deletions when its LIVE entry came without its detail (plan_items adds it)."""
    if "dead" not in live:
        raise ConfigError(
            f"shard {name}: its live entry came without its labels, quarantine and dead keys; "
            "pass the plan's shards through pack_publish.plan_items"
        )


def _index_lines(raw: bytes, keys: set[str], where: str) -> dict[str, tuple[int, int]]:
    """key -> (start, end) of its sample line in the body of DALI index RAW (the object WHERE; after the header line),
    for each of KEYS listed there. A key is found by its member names (`` <key>.``: keys are ids without dots or
    spaces), so only the lines of KEYS are looked at, not the index's thousands of others."""
    body = raw.partition(b"\n")[2]
    found = {}
    for key in keys:
        at = body.find(f" {key}.".encode())
        if at < 0:
            continue
        start = body.rfind(b"\n", 0, at) + 1
        stop = body.find(b"\n", at)
        stop = len(body) if stop < 0 else stop
        named = index_key(body[start:stop].decode())
        if named != key:
            raise ValueError(f"shard index {where}: the line at byte {start} names {named}, not {key}")
        found[key] = (start, min(stop + 1, len(body)))
    return found


def info_bytes(digest: str, labels: Counter[str], quarantine: list[dict[str, Any]]) -> bytes:
    """The sidecar of a shard: its input digest, samples per label and quarantined inputs (deterministic)."""
    info = {"digest": digest, "labels": dict(labels), "quarantine": quarantine}
    return json.dumps(info, sort_keys=True).encode()
