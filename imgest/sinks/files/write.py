"""Writing the files target: partitions stage images and parts of samples.parquet, the driver merges and publishes.

Each partition writes its images under ``DEST/_staging/<key>/`` (each under a temporary name in the parts folder,
then renamed into place, so no half-written image ever sits in the tree) and its rows, sorted by path, as one
Parquet part ``DEST/_staging/<key>.parts/part-<partition>.parquet`` (also renamed into place); it returns only a
small summary (rows per split, bytes, quarantine entries). The driver merges the parts into the version's
``samples.parquet`` a bounded batch at a time (``merge_parts``), writes the version's ``manifest.json``, renames the
staging folder to ``DEST/v/<key>`` and then switches ``DEST/manifest.json`` to it (``publish``): the only commit.
``<key>`` derives from the scan manifest, the dataset name and the transform, so a re-run writes the same folder.
The layout is described in ``imgest.sinks.files.layout``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from imgest.core import workdir
from imgest.core.errors import ImgestError
from imgest.core.locks import check_fence
from imgest.core.quarantine import QuarantineLog, quarantine_summary
from imgest.sinks.files.layout import (
    LOCK_SUFFIX,
    SAMPLES_COLUMNS,
    STAGING,
    VERSIONS,
    file_path,
    parts_dir,
    read_manifest,
    staging_dir,
    version_folder,
)
from imgest.sources.manifest import Candidate, ClassInfo
from imgest.transform.image import TransformSpec
from imgest.transform.pipeline import process_candidates

log = logging.getLogger(__name__)
MERGE_BATCH_ROWS = 65_536  # rows a merge holds per pass, all inputs together (each reads a share)
MERGE_FAN_IN = 64  # parts merged at once; more are merged in rounds (bounded open files and memory)
ROW_GROUP = 8_192  # rows per row group of parts and samples.parquet: a reader buffers one group per file
HISTORY = 20  # earlier version folders the manifest remembers (what `imgest gc files --keep` counts)
_HASH_BLOCK = 1 << 20


@dataclass(frozen=True)
class FilesConfig:
    """What every partition needs."""

    root: str  # the source dataset
    dataset: str
    dest: str  # the files dataset folder (on storage every Spark node sees)
    spec: TransformSpec
    key: str  # the version folder's name (version_key)


@dataclass
class FilesPartResult:
    """What one partition (or, merged, the whole job) wrote: a summary, never a row per image."""

    parts: list[str] = field(default_factory=list)  # part files, relative to the parts folder
    rows: int = 0
    per_split: Counter[str] = field(default_factory=Counter)
    bytes: int = 0
    quarantine: list[dict[str, Any]] = field(default_factory=list)

    def merge(self, other: FilesPartResult) -> None:
        self.parts += other.parts
        self.rows += other.rows
        self.per_split.update(other.per_split)
        self.bytes += other.bytes
        self.quarantine += other.quarantine


def samples_schema() -> Any:
    """The Arrow schema of samples.parquet (SAMPLES_COLUMNS)."""
    import pyarrow as pa

    text, number = pa.string(), pa.int64()
    types = {"label": number, "bytes": number}
    return pa.schema([(c, types.get(c, text)) for c in SAMPLES_COLUMNS])


def version_key(scan_manifest: Path, dataset: str, spec: TransformSpec) -> str:
    """The version folder's name: a digest of the scan manifest's bytes and the dataset name, then the transform
    key (``<scan>-t-<transform>``). The same scan and settings always give the same key."""
    from imgest.sinks.cassandra.ingest import transform_key

    digest = hashlib.sha256(dataset.encode() + b"\0")
    with scan_manifest.open("rb") as fh:
        while block := fh.read(_HASH_BLOCK):
            digest.update(block)
    return f"{digest.hexdigest()[:16]}-t-{transform_key(spec)}"


def write_atomic(path: Path, data: bytes, tmp_dir: Path | None = None) -> None:
    """Write PATH under a temporary name (beside it, or in TMP_DIR on the same filesystem), then rename: readers
    see the old or the new file, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial") if tmp_dir is None else tmp_dir / uuid.uuid4().hex
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_partition(
    index: int, candidates: Iterable[Candidate], cfg: FilesConfig, on_image: Callable[[int], None] | None = None
) -> FilesPartResult:
    """Transform each candidate and stage it as _staging/<key>/<split>/<wnid>/<id>.<ext>; write the rows, sorted
    by path, as part-<INDEX>.parquet of the parts folder; return the summary."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    result, quarantine = FilesPartResult(), QuarantineLog()
    dest = Path(cfg.dest)
    staging, parts = staging_dir(dest, cfg.key), parts_dir(dest, cfg.key)
    tmp = parts / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    columns: dict[str, list[Any]] = {c: [] for c in SAMPLES_COLUMNS}
    for item in process_candidates(candidates, Path(cfg.root), cfg.spec, quarantine):
        cand, data = item.candidate, item.image.data
        rel = file_path(cand.split, cand.wnid, cand.id, item.image.ext)
        write_atomic(staging / rel, data, tmp)
        row = (cand.id, rel, cand.label, cand.split, cand.wnid, len(data), hashlib.sha256(data).hexdigest())
        for column, value in zip(SAMPLES_COLUMNS, row, strict=True):
            columns[column].append(value)
        result.per_split[cand.split] += 1
        result.bytes += len(data)
        if on_image:
            on_image(len(data))
    result.rows = len(columns["path"])
    result.quarantine = [{**asdict(e), "reason": str(e.reason)} for e in quarantine.entries]
    if result.rows:
        name = f"part-{index:05d}.parquet"
        table = pa.table(columns, schema=samples_schema()).sort_by("path")
        scratch = tmp / uuid.uuid4().hex
        pq.write_table(table, scratch, compression="zstd", row_group_size=ROW_GROUP)
        os.replace(scratch, parts / name)
        result.parts = [name]
    return result


@dataclass
class MergeStats:
    """What merge_parts did: rows written, the most rows it held at once, passes over the data."""

    rows: int = 0
    peak_rows: int = 0
    passes: int = 0


def _merge_group(inputs: Sequence[Path], out: Path, batch_rows: int, stats: MergeStats) -> int:
    """Merge path-sorted Parquet INPUTS into OUT (written under a temporary name, then renamed), holding at most
    about 2 x BATCH_ROWS rows: each input reads BATCH_ROWS / len(INPUTS) rows at a time; every pass takes, from each
    input's head, the rows up to the smallest last path among the heads (that input's head is then used up)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    share = max(64, batch_rows // max(1, len(inputs)))
    streams = [pq.ParquetFile(p).iter_batches(batch_size=share, columns=list(SAMPLES_COLUMNS)) for p in inputs]

    def refill(i: int) -> Any:
        for batch in streams[i]:
            if batch.num_rows:
                return pa.Table.from_batches([batch]).cast(samples_schema())
        return None

    heads = [refill(i) for i in range(len(streams))]
    tmp = out.with_name(out.name + ".partial")
    written = 0
    with pq.ParquetWriter(tmp, samples_schema(), compression="zstd") as writer:
        while live := [i for i, h in enumerate(heads) if h is not None]:
            bound = min(heads[i].column("path")[-1].as_py() for i in live)
            taken = []
            for i in live:
                head = heads[i]
                n = int(pc.sum(pc.less_equal(head.column("path"), bound)).as_py() or 0)  # a prefix: heads are sorted
                taken.append(head.slice(0, n))
                heads[i] = head.slice(n) if n < head.num_rows else refill(i)
            chunk = pa.concat_tables(taken)
            held = chunk.num_rows + sum(h.num_rows for h in heads if h is not None)
            stats.peak_rows = max(stats.peak_rows, held)
            if chunk.num_rows:
                writer.write_table(chunk.sort_by("path"), row_group_size=ROW_GROUP)
                written += chunk.num_rows
    os.replace(tmp, out)
    stats.passes += 1
    return written


def merge_parts(
    parts: Sequence[Path], out: Path, batch_rows: int = MERGE_BATCH_ROWS, fan_in: int = MERGE_FAN_IN
) -> MergeStats:
    """One Parquet file OUT, sorted by path, of the rows of PARTS (each sorted by path), never holding more than
    about 2 x BATCH_ROWS rows; more than FAN_IN parts are merged in rounds through OUT's folder. OUT is written
    under a temporary name, then renamed."""
    stats = MergeStats()
    scratch = out.with_name(out.name + ".merge")
    level, round_ = list(parts), 0
    try:
        while len(level) > fan_in:
            scratch.mkdir(parents=True, exist_ok=True)
            merged = []
            for g in range(0, len(level), fan_in):
                step = scratch / f"round{round_}-{g // fan_in:05d}.parquet"
                _merge_group(level[g : g + fan_in], step, batch_rows, stats)
                merged.append(step)
            for path in level:
                if path.parent == scratch:
                    path.unlink()
            level, round_ = merged, round_ + 1
        stats.rows = _merge_group(level, out, batch_rows, stats)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return stats


def build_manifest(
    result: FilesPartResult, cfg: FilesConfig, version: str, classes: list[ClassInfo], scan_quarantine: QuarantineLog
) -> dict[str, Any]:
    """The version's manifest.json (no timestamps: a re-run writes the same document)."""
    quarantine = result.quarantine + [{**asdict(e), "reason": str(e.reason)} for e in scan_quarantine.entries]
    return {
        "format": "files",
        "dataset": cfg.dataset,
        "version": version,
        "layout": "<split>/<wnid>/<id>.<ext>",
        "samples": dict(sorted(result.per_split.items())),
        "bytes": result.bytes,
        "classes": [asdict(c) for c in classes],
        "quarantine": quarantine_summary(quarantine),
        "transform": cfg.spec.as_dict(),
    }


def manifest_bytes(doc: dict[str, Any]) -> bytes:
    """A manifest document as written to disk."""
    return json.dumps(doc, indent=1, sort_keys=True).encode()


def _current(dest: Path) -> dict[str, Any]:
    try:
        return read_manifest(dest)
    except ImgestError:
        return {}


def publish(dest: Path, key: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """Rename the complete staging folder of KEY to DEST/v/KEY, then switch DEST/manifest.json to it (MANIFEST plus
    ``root`` and ``history``): until that one atomic replace, readers see the previous version. A folder v/KEY
    left by an earlier run of the same key (the same content) is replaced: moved aside, then removed; if the
    manifest already named it, it is absent between those two renames. Returns what changed. A process that holds
    the dataset's lock first proves it still does (LockLostError, nothing moved, otherwise)."""
    staged, final = staging_dir(dest, key), dest / VERSIONS / key
    if not (staged / workdir.PUBLISHED_SAMPLES).is_file():
        raise ImgestError(
            f"{staged} holds no {workdir.PUBLISHED_SAMPLES}: the version is incomplete; run the job again"
        )
    check_fence(str(manifest.get("dataset", "")))
    live = _current(dest)
    root, previous = version_folder(key), live.get("root", "")
    final.parent.mkdir(parents=True, exist_ok=True)
    aside = dest / STAGING / f"{key}.replaced"
    if final.exists():
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(final, aside)  # the same key: the same content, written again
    os.rename(staged, final)
    history = [r for r in [previous, *live.get("history", [])] if r and r != root]
    doc = {**manifest, "root": root, "history": list(dict.fromkeys(history))[:HISTORY]}
    write_atomic(dest / workdir.PUBLISHED_MANIFEST, manifest_bytes(doc))
    shutil.rmtree(aside, ignore_errors=True)
    log.info("published %s as %s (previous: %s)", dest, root, previous or "none")
    return {"root": root, "previous_root": previous, "replaced_same_key": previous == root}


@contextmanager
def staging(dest: Path, key: str) -> Iterator[Path]:
    """Hold version KEY's staging lock (``DEST/_staging/<key>.lock``, which ``imgest gc files`` respects) for a
    job's run; what an earlier, failed run of KEY left is removed first, and the parts folder on exit."""
    import fcntl

    base = dest / STAGING
    base.mkdir(parents=True, exist_ok=True)
    lock_path = base / f"{key}{LOCK_SUFFIX}"
    with lock_path.open("a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ImgestError(
                f"{lock_path} is held: another job is writing version {key} of {dest}; wait for it to finish"
            ) from None
        for stale in (staging_dir(dest, key), parts_dir(dest, key)):
            shutil.rmtree(stale, ignore_errors=True)
        try:
            yield staging_dir(dest, key)
        finally:
            shutil.rmtree(parts_dir(dest, key), ignore_errors=True)
            lock_path.unlink(missing_ok=True)
    with suppress(OSError):
        base.rmdir()  # only when nothing else is staged
