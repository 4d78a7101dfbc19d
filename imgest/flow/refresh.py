"""Incremental refresh of a registered dataset: the steps the `refresh_<name>` DAGs (and `imgest refresh`) run.

    scan (the ingest's own step) -> plan_refresh -> [Spark job on the delta] -> finish_refresh

``plan_refresh`` compares the new scan with the baseline of the last complete version of the target
(``<work>/refresh/<target>/``) and writes what the job needs: the delta manifest (added + changed images) for
Cassandra, the shard plan (every shard kept, its removed and changed samples marked dead, see replan) for shards.
``finish_refresh`` applies the rest (Cassandra: record the version's lineage, delete removed rows; unchanged rows
are not touched), verifies the new version and only then moves the baseline forward. A failed refresh leaves the
baseline where it was; the next run redoes the same version.
"""

from __future__ import annotations

import json
import logging
import shutil
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from imgest.core import workdir
from imgest.core.errors import ConfigError
from imgest.core.settings import CassandraSettings, S3Settings
from imgest.flow.registry import REFRESH_TARGETS
from imgest.flow.request import IngestRequest
from imgest.sources.diff import KnownHashes, SourceChanges, diff_manifest, write_rows
from imgest.sources.manifest import manifest_metadata

log = logging.getLogger(__name__)
STATE = "state.json"  # the last complete version: number, name, counts
BASELINE = "baseline.parquet"  # its manifest rows with source sha256
PLAN = "plan.parquet"  # its shard plan (shards target)
PENDING = "pending.json"  # the version being made: what finish_refresh needs
NEXT_BASELINE = "baseline.next.parquet"
SCANNED_BASELINE = "baseline.scan.parquet"  # the scan's rows with their sha256, written by the diff
NEXT_PLAN = "plan.next.parquet"
REMOVED = "removed.parquet"  # (id, split) of the images the pending version removes
REMOVED_SCHEMA = pa.schema([("id", pa.string()), ("split", pa.string())])
VERSION_INFO = "version.json"
DELTA = "delta"


def refresh_dir(dataset: str, target: str) -> Path:
    return workdir.dataset_workdir(dataset) / "refresh" / target


def read_state(dataset: str, target: str) -> dict[str, Any] | None:
    path = refresh_dir(dataset, target) / STATE
    return json.loads(path.read_text()) if path.is_file() else None


def version_name(request: IngestRequest, number: int) -> str:
    from imgest.sinks.cassandra.ingest import transform_key

    return f"t-{transform_key(request.transform())}-r{number}"


def compiled_decoder_of(previous_version: str, request: IngestRequest) -> str | None:
    """The region decoder revision PREVIOUS_VERSION was written with, where REQUEST leaves the decoder to ``auto`` on
    an installation without the compiled decoder (there ``auto`` means Pillow: other bytes); else None."""
    from imgest.sinks.cassandra.ingest import key_of_fields
    from imgest.transform import fastjpeg
    from imgest.transform.revisions import REGION_DECODERS

    if request.jpeg_decoder != "auto" or fastjpeg.available():
        return None
    fields, prefix = request.transform().as_dict(), previous_version.rsplit("-r", 1)[0]
    return next((r for r in REGION_DECODERS if prefix == f"t-{key_of_fields({**fields, 'jpeg_decoder': r})}"), None)


def _refuse_silent_pillow(previous_version: str, request: IngestRequest) -> None:
    """ConfigError when ``auto`` would quietly re-transform a dataset the compiled decoder wrote with Pillow."""
    from imgest.transform.fastjpeg import BUILD_HINT

    revision = compiled_decoder_of(previous_version, request)
    if revision:
        raise ConfigError(
            f"{request.dataset}/{request.target}: version {previous_version} was written with imgest's compiled JPEG "
            f"decoder ({revision}), which this installation lacks ({BUILD_HINT}); jpeg_decoder 'auto' would mean "
            "Pillow here and re-transform every image. Install imgest with its compiled decoder (the wheel has it), "
            "or set jpeg_decoder to 'pillow' to re-transform on purpose."
        )


def _transform_changed(previous_version: str, request: IngestRequest) -> bool:
    """Whether REQUEST's transform differs from the one PREVIOUS_VERSION (t-<transform key>-r<N>) was written with:
    then no stored image can be kept (an upgrade that changes the JPEG decoder counts too)."""
    return previous_version.rsplit("-r", 1)[0] != version_name(request, 0).rsplit("-r", 1)[0]


def plan_refresh(
    conf: dict[str, Any], manifest_dir: Path, cassandra: CassandraSettings | None = None
) -> dict[str, Any]:
    """Compare the scan in MANIFEST_DIR with the last complete version; write the delta and return the plan
    (``changed`` False: nothing to do, no Spark job, no new version). CASSANDRA (the Cassandra target): where the
    ingest recorded the source sha256 of the images the baseline never read."""
    request = IngestRequest.from_conf(conf)
    with ExitStack() as stack:
        return _plan(request, manifest_dir, _known_hashes(request, cassandra, stack))


def _known_hashes(request: IngestRequest, cassandra: CassandraSettings | None, stack: ExitStack) -> KnownHashes | None:
    """The Cassandra target's recorded source hashes (a session opened on the first question, closed by STACK)."""
    if request.target != "cassandra" or cassandra is None:
        return None
    session: list[Any] = []

    def known(rows: list[tuple[str, str]]) -> dict[str, str]:
        from imgest.sinks.cassandra.client import cassandra_session
        from imgest.sinks.cassandra.refresh import recorded_hashes

        if not session:
            session.append(stack.enter_context(cassandra_session(cassandra)))
        return recorded_hashes(session[0], request.tables(), rows)

    return known


def _plan(request: IngestRequest, manifest_dir: Path, known: KnownHashes | None) -> dict[str, Any]:
    """plan_refresh for REQUEST, KNOWN answering for the baseline's unread hashes."""
    if request.target not in REFRESH_TARGETS:
        raise ConfigError(f"refresh supports the targets {', '.join(REFRESH_TARGETS)}, not {request.target!r}")
    rdir = refresh_dir(request.dataset, request.target)
    rdir.mkdir(parents=True, exist_ok=True)
    state = read_state(request.dataset, request.target)
    manifest = manifest_dir / workdir.MANIFEST
    root = Path(manifest_metadata(manifest)["root"])
    scanned = rdir / SCANNED_BASELINE
    if state:
        _refuse_silent_pillow(state["version"], request)
    changes = diff_manifest(manifest, rdir / BASELINE if state else None, root, scanned, known=known)
    if state and _transform_changed(state["version"], request):
        log.warning(
            "%s/%s: the transform differs from version %s's (settings or JPEG decoder): every image is re-transformed",
            request.dataset,
            request.target,
            state["version"],
        )
        changes = changes.all_changed(manifest)
    counts = changes.counts()
    if state and not changes.any:
        scanned.unlink()
        log.info("%s/%s: no change since version %s (%s)", request.dataset, request.target, state["version"], counts)
        return {"changed": False, "version": state["version"], "counts": counts, "target": request.target}
    number = state["number"] + 1 if state else 1
    version = version_name(request, number)
    scanned.replace(rdir / NEXT_BASELINE)
    _write_removed(rdir / BASELINE if state else None, changes, rdir / REMOVED)
    pending = {
        "number": number,
        "version": version,
        "previous": state["version"] if state else None,
        "counts": counts,
        "removed_file": REMOVED,
        "planned_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    log.info("%s/%s: version %s from %s: %s", request.dataset, request.target, version, pending["previous"], counts)
    args = (_cassandra_args if request.target == "cassandra" else _shards_args)(request, manifest_dir, changes, pending)
    (rdir / PENDING).write_text(json.dumps(pending))  # what finish_refresh needs, after the shard plan added to it
    return {"changed": True, "version": version, "counts": counts, "target": request.target, "job_args": args}


def _write_removed(baseline: Path | None, changes: SourceChanges, path: Path) -> None:
    """Write (id, split) of the removed images to PATH, from the last version's baseline, in its order (streamed:
    the file has as many rows as were removed, the memory holds a batch)."""
    if baseline is None or not len(changes.removed_at):
        pq.write_table(REMOVED_SCHEMA.empty_table(), path)
        return
    rows = np.zeros(pq.ParquetFile(baseline).metadata.num_rows, bool)
    rows[changes.removed_at] = True
    write_rows(baseline, path, rows, columns=["id", "split"])


def removed_rows(rdir: Path) -> pa.Table:
    """(id, split) of the images the pending version in RDIR removes (empty when none)."""
    pending = json.loads((rdir / PENDING).read_text())
    if "removed" in pending:  # a plan written before the removed rows went to a file
        rows = pending["removed"]
        return pa.table({"id": [r[0] for r in rows], "split": [r[1] for r in rows]}, schema=REMOVED_SCHEMA)
    path = rdir / pending.get("removed_file", REMOVED)
    return pq.read_table(path, columns=["id", "split"]) if path.is_file() else REMOVED_SCHEMA.empty_table()


def _cassandra_args(
    request: IngestRequest, manifest_dir: Path, changes: SourceChanges, pending: dict[str, Any]
) -> list[str]:
    """The delta (added + changed) as a work folder of its own; the job upserts it under the new version."""
    from imgest.flow.steps import cassandra_job_args

    delta = refresh_dir(request.dataset, request.target) / DELTA
    delta.mkdir(exist_ok=True)
    write_rows(manifest_dir / workdir.MANIFEST, delta / workdir.MANIFEST, changes.rewritten_rows())
    for name in (workdir.CLASSES, workdir.SCAN_QUARANTINE, workdir.SCAN_REPORT):
        shutil.copyfile(manifest_dir / name, delta / name)
    args = cassandra_job_args(request, delta)
    return [*args, "--version", pending["version"], "--replace-version"]


def _shards_args(
    request: IngestRequest, manifest_dir: Path, changes: SourceChanges, pending: dict[str, Any]
) -> list[str]:
    """The shard plan: the last version's shards kept, their removed and changed samples marked dead, plus new ones
    (see replan); everything re-cut the first time, when the shard settings changed and when no image is unchanged
    (a new transform): then the first version's out-of-core plan, since the re-plan holds the rows it cuts."""
    from dataclasses import asdict

    from imgest.flow.steps import shards_job_args
    from imgest.sinks.shards.plan import build_plan
    from imgest.sinks.shards.replan import replan_file

    rdir = refresh_dir(request.dataset, request.target)
    old = rdir / PLAN
    sharding = asdict(request.shards())
    state = read_state(request.dataset, request.target) or {}
    same_cut = state.get("sharding", sharding) == sharding  # a version before this was recorded: assume the same
    pending["sharding"] = sharding
    if pending["previous"] and old.is_file() and same_cut and changes.unchanged:
        result = replan_file(
            old,
            manifest_dir / workdir.MANIFEST,
            changes.rewritten_rows(),
            changes.touched(),
            request.shards(),
            request.transform(),
            pending["number"],
            rdir / NEXT_PLAN,
        )
        pending.update(kept_shards=len(result.kept), dropped_shards=result.dropped, new_shards=result.new)
        pending.update(marked_shards=len(result.marked), dead_samples=result.dead)
        log.info(
            "shards: %d kept (%d with %d dead samples), %d re-cut, %d new",
            len(result.kept),
            len(result.marked),
            result.dead,
            len(result.dropped),
            len(result.new),
        )
    else:  # the first version, new shard settings or nothing kept: the ingest's own plan, in bounded memory
        if pending["previous"] and not same_cut:
            log.warning("%s: shard settings changed since %s: every shard is re-cut", request.dataset, state["version"])
        build_plan(manifest_dir / workdir.MANIFEST, rdir / NEXT_PLAN, request.shards(), request.transform())
    info = {
        "name": pending["version"],
        "number": pending["number"],
        "previous": pending["previous"],
        "changes": pending["counts"],
    }
    (rdir / VERSION_INFO).write_text(json.dumps(info))
    args = shards_job_args(request, manifest_dir)
    return [*args, "--plan", str(rdir / NEXT_PLAN), "--version-info", str(rdir / VERSION_INFO)]


def finish_refresh(
    conf: dict[str, Any],
    manifest_dir: Path,
    cassandra: CassandraSettings | None,
    s3: S3Settings | None,
    verified: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Apply what the job leaves (Cassandra), verify the new version, then move the baseline forward. VERIFIED: the
    shards' verification done elsewhere (the report of jobs/verify_shards.py, which checked them on Spark's
    executors: the refresh DAG's shards.verify task, `imgest refresh`), which must say ok; None: verified here."""
    request = IngestRequest.from_conf(conf)
    rdir = refresh_dir(request.dataset, request.target)
    pending = json.loads((rdir / PENDING).read_text())
    if request.target == "cassandra":
        if cassandra is None:
            raise ConfigError("the Cassandra target needs Cassandra settings")
        report = _finish_cassandra(request, manifest_dir, cassandra, pending, rdir)
    elif verified is not None:
        if not verified.get("ok"):
            from imgest.sinks.shards.verify import ShardVerificationError

            raise ShardVerificationError(f"the shards' verification failed: {verified}")
        report = verified
    else:
        from imgest.flow.steps import verify_shards

        report = verify_shards(request.shard_dest, s3, hash_kept=False)  # kept shards: hashed when written
    (rdir / NEXT_BASELINE).replace(rdir / BASELINE)
    if (rdir / NEXT_PLAN).is_file():
        from imgest.sinks.shards.plan import sidecar

        (rdir / NEXT_PLAN).replace(rdir / PLAN)
        if sidecar(rdir / NEXT_PLAN).is_file():
            sidecar(rdir / NEXT_PLAN).replace(sidecar(rdir / PLAN))
        else:
            sidecar(rdir / PLAN).unlink(missing_ok=True)
    state = {k: v for k, v in pending.items() if k not in ("removed", "removed_file")}
    state["completed_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    (rdir / STATE).write_text(json.dumps(state, indent=1) + "\n")
    (rdir / PENDING).unlink()
    (rdir / REMOVED).unlink(missing_ok=True)
    history = rdir / "versions.jsonl"
    with history.open("a") as fh:
        fh.write(json.dumps(state) + "\n")
    return {
        "dataset": request.dataset,
        "target": request.target,
        "version": pending["version"],
        "counts": pending["counts"],
        "verification": report,
    }


def _finish_cassandra(
    request: IngestRequest, manifest_dir: Path, settings: CassandraSettings, pending: dict[str, Any], rdir: Path
) -> dict[str, Any]:
    from imgest.sinks.cassandra.client import cassandra_session
    from imgest.sinks.cassandra.refresh import RefreshRows, apply_refresh, quarantined_ids, record_changes
    from imgest.sinks.cassandra.verify import VerificationError, verify

    removed = removed_rows(rdir)
    tables = request.tables()
    with cassandra_session(settings) as session:
        # Only the previous version's quarantined ids are looked up in what the refresh touched (bounded by the
        # quarantine, not the dataset): the delta and the removed rows stay Arrow columns.
        quarantined = quarantined_ids(session, tables.keyspace, request.dataset, pending["previous"])
        touched = _among_file(rdir / DELTA / workdir.MANIFEST, quarantined) | _among(removed.column("id"), quarantined)
        rows = RefreshRows(touched, removed)
        applied = apply_refresh(session, tables, request.dataset, pending["version"], pending["previous"], rows)
        # the job recorded the delta's counts only: the version's rows are counted in the table (token ranges)
        report = verify(session, manifest_dir, tables, request.dataset, pending["version"], count_rows=True)
        if not report.ok:
            raise VerificationError(f"refresh {pending['version']} does not match the scan: {report.to_dict()}")
        record_changes(session, tables.keyspace, request.dataset, pending["version"], pending["counts"], report.found)
    return {**report.to_dict(), **applied}


def _among_file(path: Path, wanted: set[str]) -> set[str]:
    """The ids of the parquet file PATH that are in WANTED, read a batch at a time (nothing read when WANTED is
    empty, as after a first version)."""
    if not wanted:
        return set()
    found: set[str] = set()
    for batch in pq.ParquetFile(path).iter_batches(batch_size=65_536, columns=["id"]):
        found |= _among(batch.column(0), wanted)
    return found


def _among(ids: pa.ChunkedArray | pa.Array, wanted: set[str]) -> set[str]:
    """The ids of IDS that are in WANTED (a set as small as WANTED, whatever the size of IDS)."""
    if not wanted or not len(ids):
        return set()
    hits = pc.filter(ids, pc.is_in(ids, value_set=pa.array(sorted(wanted), pa.string())))
    return set(hits.to_pylist())
