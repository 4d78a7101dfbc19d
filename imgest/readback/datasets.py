"""What a read-back check must read: the ids, labels and recorded sha256 of one dataset version (or split).

By default a loader keeps every row of the split; given a sample size it keeps a seeded, class-balanced sample
(whole shards for the shard target), choosing it from metadata streamed in chunks (``imgest.core.sampling``),
and says what it kept in ``ReadSet.sample``. Everything per image is a numpy column, never a Python object.

Each loader refuses a version that is not finished (Cassandra: status ``complete``; shards and files: a
published ``manifest.json``) unless asked explicitly, and names what it looked for.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from imgest.core import defaults, workdir
from imgest.core.errors import NotReadableError
from imgest.core.sampling import BalancedSample, ClassCounts, Columns, SampleReport, balance, pick_shards
from imgest.core.textcols import recorded_digests
from imgest.sinks.cassandra.versions import VersionNotFoundError, version_members
from imgest.sinks.cassandra.versions import records as version_records

log = logging.getLogger(__name__)
CHUNK = 65_536  # metadata rows converted to columns at a time


@dataclass
class ReadSet:
    """What one check reads of a dataset version (or split of it), as columns: ``rows`` holds ``id``
    (fixed-width bytes), ``label`` (int32), ``sha256`` ((n, 32) uint8, recorded at ingest), ``recorded``
    (bool: False where the sha256 comes with the sample, as in shards) and, for files, ``path``."""

    kind: str  # cassandra | shards | files
    location: str
    rows: Columns
    bytes: int = 0
    root: str = ""  # files: the folder the paths are relative to
    shards: list[str] = field(default_factory=list)  # shards: the tars to read, relative to location (all hold rows)
    indexes: list[str] = field(default_factory=list)  # shards: the DALI index of each tar (only its live samples)
    dead: dict[str, frozenset[str]] = field(default_factory=dict)  # shards: tar -> keys a refresh took out of it
    table: str = ""  # cassandra: keyspace.data table
    version: str = ""
    sample: SampleReport | None = None  # which part of the split this is

    def __len__(self) -> int:
        return len(self.rows["id"])

    @property
    def ids(self) -> np.ndarray:
        return self.rows["id"]

    @property
    def labels(self) -> np.ndarray:
        return self.rows["label"]

    def id_list(self) -> list[str]:
        """The ids as text (a list the size of the set: for readers and tests, not for bookkeeping)."""
        return [i.decode() for i in self.rows["id"].tolist()]

    @property
    def paths(self) -> list[str]:
        """Files: absolute paths, in ids order (what fn.readers.file is given)."""
        root = self.root.rstrip("/")
        return [f"{root}/{p.decode()}" for p in self.rows.get("path", np.zeros(0, "S1")).tolist()]


def _empty(**extra: np.ndarray) -> Columns:
    return {
        "id": np.zeros(0, "S1"),
        "label": np.zeros(0, np.int32),
        "sha256": np.zeros((0, 32), np.uint8),
        "recorded": np.zeros(0, bool),
        **extra,
    }


def _text_column(values: Iterable[Any]) -> np.ndarray:
    """Fixed-width bytes (UTF-8) of VALUES as text."""
    encoded = [str(v).encode() for v in values]
    return np.array(encoded, dtype="S") if encoded else np.zeros(0, "S1")


def files_set(
    root: Path, split: str | None = "train", sample: int = 0, seed: int = defaults.CHECK_SAMPLE_SEED
) -> ReadSet:
    """A published files dataset (its manifest.json) or NotReadableError: a seeded class-balanced SAMPLE of the
    split's files (every file when SAMPLE is 0), samples.parquet streamed in chunks."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from imgest.sinks.files.layout import FilesDatasetError, data_root, read_manifest

    try:
        manifest = read_manifest(root)
        folder = data_root(root, manifest)  # the version folder the manifest names
    except FilesDatasetError as exc:
        raise NotReadableError(str(exc)) from None
    version = manifest.get("version", "")
    where = folder / workdir.PUBLISHED_SAMPLES
    if not where.is_file():
        raise NotReadableError(f"{folder} has no {workdir.PUBLISHED_SAMPLES}; publish the files dataset again")
    picker = BalancedSample(sample, seed, _empty(path=np.zeros(0, "S1"), nbytes=np.zeros(0, np.int64)))
    columns = ["id", "path", "label", "split", "bytes", "sha256"]
    for batch in pq.ParquetFile(where).iter_batches(batch_size=CHUNK, columns=columns):
        if split is not None:
            batch = batch.filter(pc.equal(batch.column("split"), split))
        sha, recorded = recorded_digests(batch.column("sha256"), str(where))
        picker.add(
            {
                "id": _text_column(batch.column("id").to_pylist()),
                "label": batch.column("label").to_numpy(zero_copy_only=False).astype(np.int32),
                "sha256": sha,
                "recorded": recorded,
                "path": _text_column(batch.column("path").to_pylist()),
                "nbytes": batch.column("bytes").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64),
            }
        )
    rows, report = picker.result()
    nbytes = int(rows.pop("nbytes").sum())
    return ReadSet("files", str(root), rows, nbytes, root=str(folder), version=version, sample=report)


def shards_set(
    store: Any, split: str | None = "train", sample: int = 0, seed: int = defaults.CHECK_SAMPLE_SEED
) -> ReadSet:
    """A published shard dataset (manifest.json + the samples table it names): a seeded subset of whole shards
    holding about SAMPLE samples (every shard when SAMPLE is 0), with every sample in them; sha256 comes with each
    .json. ``ReadSet.shards`` holds the tars' objects relative to the destination (``v/<key>/<name>``), ``indexes``
    their DALI indexes and ``dead`` the samples a refresh took out of a kept tar (readers skip them)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from imgest.sinks.shards.shard_table import dead_keys
    from imgest.sinks.shards.store_names import samples_object, shard_object, shard_objects

    manifest = store.read_manifest()
    if manifest is None:
        raise NotReadableError(f"{store.location} holds no published shard dataset (no manifest.json)")
    chunks = store.read_chunks(samples_object(manifest))
    if chunks is None:
        raise NotReadableError(f"{store.location} has no {samples_object(manifest)}")
    entries = [s for s in manifest["shards"] if split is None or s["split"] == split]
    parquet = pq.ParquetFile(io.BytesIO(b"".join(chunks)))
    if "shard" not in parquet.schema_arrow.names and sample:
        log.warning("%s/%s has no shard column: reading every shard", store.location, samples_object(manifest))
        sample = 0
    chosen = pick_shards([e["name"] for e in entries], [e["samples"] for e in entries], sample, seed)
    picked = [entries[i] for i in chosen]
    names = pa.array([e["name"] for e in picked], pa.string())
    seen, parts = ClassCounts(), [_empty()]
    columns = [c for c in ("id", "label", "split", "shard") if c in parquet.schema_arrow.names]
    for batch in parquet.iter_batches(batch_size=CHUNK, columns=columns):
        if split is not None:
            batch = batch.filter(pc.equal(batch.column("split"), split))
        labels = batch.column("label").to_numpy(zero_copy_only=False).astype(np.int32)
        seen.add(labels)
        if len(picked) < len(entries):
            mask = pc.is_in(batch.column("shard"), value_set=names)
            batch, labels = batch.filter(mask), labels[mask.to_numpy(zero_copy_only=False)]
        n = batch.num_rows
        ids = _text_column(batch.column("id").to_pylist())
        parts.append({"id": ids, "label": labels, "sha256": np.zeros((n, 32), np.uint8), "recorded": np.zeros(n, bool)})
    rows = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    dead = dead_keys(store, manifest, {e["name"] for e in picked})
    unit = f"whole shards ({len(picked)} of {len(entries)})"
    report = SampleReport(sample, seed, seen.total, len(rows["id"]), unit, balance(rows["label"], seen.labels))
    return ReadSet(
        "shards",
        store.location,
        rows,
        sum(int(e["bytes"]) for e in picked),
        shards=[shard_object(e) for e in picked],
        indexes=[shard_objects(e)[1] for e in picked],
        dead={shard_object(e): keys for e in picked if (keys := dead.get(e["name"]))},
        sample=report,
    )


def cassandra_set(
    session: Any,
    tables: Any,
    dataset: str,
    version: str | None = None,
    split: str | None = "train",
    allow_incomplete: bool = False,
    sample: int = 0,
    seed: int = defaults.CHECK_SAMPLE_SEED,
) -> ReadSet:
    """The rows of one version of DATASET in TABLES (a TableLayout); the newest complete version by default. A
    seeded class-balanced SAMPLE of them (every row when SAMPLE is 0); the metadata is paged, in chunks."""
    ks = tables.keyspace
    try:
        records = version_records(session, ks, dataset)
    except VersionNotFoundError as exc:  # not an imgest keyspace: the message says how to adopt it
        raise NotReadableError(str(exc)) from None
    if version is not None:
        records = [r for r in records if r.version == version]
    if not records:
        raise NotReadableError(f"no version {version or ''} of dataset {dataset!r} in {ks}.dataset_versions")
    ready = [r for r in records if r.status == "complete" or allow_incomplete]
    if not ready:
        states = ", ".join(f"{r.version}={r.status}" for r in records)
        raise NotReadableError(
            f"dataset {dataset!r} in {ks} has no complete version ({states}); verify it first, or allow incomplete"
        )
    chosen = ready[-1].version
    meta = f"{ks}.{tables.metadata_table(split or 'train')}"
    from imgest.readback.cassandra_sample import known_counts, metadata_chunks, sampled_rows

    empty = _empty(nbytes=np.zeros(0, np.int64))
    members = version_members(session, ks, dataset, chosen)  # a refreshed version's lineage
    known = known_counts(session, ks, dataset, chosen, split) if sample and split else None
    if known is not None:  # from a share of the ring (module cassandra_sample)
        picked, report = sampled_rows(session, meta, dataset, members, split or "train", sample, seed, known, empty)
    else:
        picker = BalancedSample(sample, seed, empty)
        for chunk in metadata_chunks(session, meta, dataset, members, split):  # this version's rows only
            picker.add(chunk)
        picked, report = picker.result()
    nbytes = int(picked.pop("nbytes").sum())
    table = f"{ks}.{tables.data_table(split or 'train')}"
    return ReadSet("cassandra", table, picked, nbytes, table=table, version=chosen, sample=report)


def json_meta(raw: np.ndarray) -> dict[str, Any]:
    """The .json member of a shard sample as a dict."""
    return json.loads(raw.tobytes())
