"""The read-back check where DALI cannot be imported (imgest installed without ``imgest[dali]``).

Which readers need DALI, per target, and what runs instead:

| target | DALI's own readers (skipped) | readers that run without DALI (raw mode) |
| --- | --- | --- |
| cassandra | none | ``cassandra``, ``cassandra-simple`` |
| files | ``files`` (``fn.readers.file``) | ``files-stream`` (imgest's files reader, FilesResume) |
| shards, folder | ``shards-folder`` (``fn.readers.webdataset``) | ``shards-folder-stream`` (imgest's tar reader) |
| shards, S3 | ``shards-s3-dali`` (``fn.readers.webdataset``, s3://) | ``shards-s3-stream``, ``shards-s3-webdataset`` |

Those that run hand their batches to a :class:`~imgest.readback.pipelines.HostPipeline` instead of
``fn.external_source``, in raw mode only (the train mode decodes, crops and normalizes in DALI) whatever modes
were asked, so the check still proves every stored byte: each sample hashed against its recorded sha256, its label
checked, each id once. Each skipped reader and mode is listed with the reason; one WARNING says what ran.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np

from imgest.readback.budget import CheckClock, ReaderBudget, expect, next_budget
from imgest.readback.check import ReadCheckOptions, cassandra_run, cassandra_simple_run
from imgest.readback.check_s3 import s3_stream_run, s3_webdataset_run
from imgest.readback.datasets import ReadSet
from imgest.readback.measure import RunResult
from imgest.readback.pipelines import PipelineSpec
from imgest.readback.readers import ExternalBatch, run_external
from imgest.readback.resumable import FilesResume, folder_fetch
from imgest.readback.resume import ReaderState
from imgest.readback.s3shards import Sample

log = logging.getLogger(__name__)
HOST = "host memory, no DALI (raw bytes only)"
# The reader kinds of a target: cassandra, files, shards-folder, shards-s3.
DALI_READERS: dict[str, tuple[str, ...]] = {
    "cassandra": (),
    "files": ("files",),
    "shards-folder": ("shards-folder",),
    "shards-s3": ("shards-s3-dali",),
}
HOST_READERS: dict[str, tuple[str, ...]] = {
    "cassandra": ("cassandra", "cassandra-simple"),
    "files": ("files-stream",),
    "shards-folder": ("shards-folder-stream",),
    "shards-s3": ("shards-s3-stream", "shards-s3-webdataset"),
}


def reader_kind(target: str, location: str) -> str:
    """Which readers apply to TARGET at LOCATION: cassandra, files, shards-folder or shards-s3."""
    if target in ("cassandra", "files"):
        return target
    return "shards-s3" if location.startswith("s3://") else "shards-folder"


def skipped_without_dali(kind: str, modes: tuple[str, ...], reason: str) -> list[str]:
    """``reader (mode): REASON`` for each reader and mode of KIND that needs DALI: DALI's own readers in every
    mode of MODES, the others in every mode but raw."""
    return [
        f"{name} ({mode}): {reason}"
        for mode in modes
        for name in (*DALI_READERS[kind], *(HOST_READERS[kind] if mode != "raw" else ()))
    ]


def files_stream_run(rs: ReadSet, spec: PipelineSpec, budget: ReaderBudget | None = None) -> RunResult:
    """imgest's files reader (FilesResume: a batch's files read by threads) over the ReadSet's files."""
    reader = FilesResume(rs.paths, rs.labels, rs.ids, ReaderState(), 0, spec.batch_size)
    batches = ((b.images, b.labels, b.ids, b.sha256) for b in reader.batches(mark=False))
    return run_external("files-stream", rs, spec, batches, {"reader": "imgest FilesResume"}, budget=budget)


def sample_batches(samples: Iterator[Sample], batch_size: int) -> Iterator[ExternalBatch]:
    """Shard samples (image, label, key, json member) in batches of BATCH_SIZE, each with its stored sha256."""
    while batch := list(itertools.islice(samples, batch_size)):
        yield (
            [s[0] for s in batch],
            np.array([s[1] for s in batch], np.int32),
            [str(s[3].get("id", s[2])) for s in batch],
            [s[3].get("sha256") for s in batch],
        )


def folder_stream_run(rs: ReadSet, root: str, spec: PipelineSpec, budget: ReaderBudget | None = None) -> RunResult:
    """imgest's tar reader (whole shards read and parsed in memory, a refresh's dead samples left out) over the
    ReadSet's shards in the folder ROOT."""
    fetch = folder_fetch(root, rs.dead)
    samples = (s for shard in fetch([(name, 0) for name in rs.shards]) for s in shard)
    settings = {"reader": "imgest tar reader (folder_fetch)", "shards": len(rs.shards)}
    batches = sample_batches(samples, spec.batch_size)
    return run_external("shards-folder-stream", rs, spec, batches, settings, budget=budget)


def runs_without_dali(
    target: str,
    location: str,
    settings: dict[str, Any],
    rs: ReadSet,
    opts: ReadCheckOptions,
    reason: str,
    clock: CheckClock | None = None,
) -> tuple[list[RunResult], list[str]]:
    """The readers of TARGET that need no DALI, in raw mode, over RS, each within its share of CLOCK; with them the
    readers and modes skipped for REASON (why DALI cannot be used), one line each."""
    kind = reader_kind(target, location)
    spec = opts.spec("raw")
    skipped = skipped_without_dali(kind, opts.modes, reason)
    log.warning(
        "read-back of %s without DALI: %s; measuring %s in raw mode; skipped: %s",
        location or rs.location,
        reason,
        ", ".join(HOST_READERS[kind]),
        ", ".join(s.split(":", 1)[0] for s in skipped) or "none",
    )
    expect(clock, len(HOST_READERS[kind]))
    if kind == "cassandra":
        results = [cassandra_run(settings["cassandra"], rs, spec, opts.cassandra, budget=next_budget(clock))]
        results.append(cassandra_simple_run(settings["cassandra"], rs, spec, budget=next_budget(clock)))
    elif kind == "files":
        results = [files_stream_run(rs, spec, next_budget(clock))]
    elif kind == "shards-folder":
        results = [folder_stream_run(rs, location, spec, next_budget(clock))]
    else:
        bucket, _, prefix = location[5:].partition("/")
        sopts = replace(opts.s3, shuffle_buffer=0)
        results = [s3_stream_run(rs, settings["s3"], bucket, prefix, spec, sopts, budget=next_budget(clock))]
        results.append(s3_webdataset_run(rs, settings["s3"], bucket, prefix, spec, budget=next_budget(clock)))
    for result in results:
        result.settings["pipeline"] = HOST
    return results, skipped
