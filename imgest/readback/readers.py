"""Each reader, built over a ReadSet and run for one epoch through the same DALI pipeline.

| reader | how |
| --- | --- |
| ``files`` | ``fn.readers.file`` over the files target (the baseline) |
| ``shards-folder`` | ``fn.readers.webdataset`` with our ``.idx`` files |
| ``shards-s3-dali`` | ``fn.readers.webdataset`` over ``s3://`` URLs (DALI's own S3 support) |
| ``shards-s3-stream`` | imgest's streaming reader (whole-shard GETs in parallel, shuffle buffer) |
| ``shards-s3-webdataset`` | ``webdataset.WebDataset`` streaming the same objects (the peer) |
| ``cassandra`` | imgest's Cassandra reader (prefetch, requests in flight, out-of-order window) |
| ``cassandra-simple`` | one ``execute_concurrent_with_args`` per batch, no prefetch (the straightforward one) |
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from imgest.core.sampling import IdIndex
from imgest.readback.datasets import ReadSet, json_meta
from imgest.readback.measure import Identify, RunResult, measure
from imgest.readback.pipelines import READER, PipelineSpec, external_pipeline, file_pipeline, webdataset_pipeline

log = logging.getLogger(__name__)
ExternalBatch = tuple[list[np.ndarray], np.ndarray, list[str], list[str | None]]  # images, labels, ids, sha256s


class FeedQueue:
    """An external_source callable over an iterator of batches; remembers ids and sha256s in feeding order."""

    def __init__(self, batches: Iterator[ExternalBatch]) -> None:
        self.batches = batches
        self.pending: collections.deque[tuple[str, str | None]] = collections.deque()

    def __call__(self) -> tuple[list[np.ndarray], np.ndarray]:
        images, labels, ids, shas = next(self.batches)  # StopIteration ends the epoch
        self.pending.extend(zip(ids, shas, strict=True))
        return images, labels

    def identify(self, out: tuple[Any, ...], i: int) -> tuple[str, int, str | None]:
        key, sha = self.pending.popleft()
        return key, int(out[1].at(i)), sha

    def close(self) -> None:
        """Stop the batches' reader now (its read-ahead, its threads), also when the epoch was cut short."""
        close = getattr(self.batches, "close", None)
        if close is not None:
            close()


def run_external(
    name: str, rs: ReadSet, spec: PipelineSpec, batches: Iterator[ExternalBatch], settings: dict[str, Any], **kw: Any
) -> RunResult:
    """A reader that feeds fn.external_source; its batches are closed when the epoch ends or is cut short."""
    feed = FeedQueue(batches)
    kw.setdefault("verify_after", spec.verify_after)
    kw.setdefault("started", time.perf_counter())
    try:
        pipe = external_pipeline(spec, feed)
        return measure(name, pipe, spec.mode, rs, feed.identify, total=len(rs), settings=settings, **kw)
    finally:
        feed.close()


def run_files(rs: ReadSet, spec: PipelineSpec, **kw: Any) -> RunResult:
    """fn.readers.file over the files target, in ReadSet order."""
    kw.setdefault("started", time.perf_counter())
    paths = rs.paths
    by_path = IdIndex(np.array([p.encode() for p in paths], dtype="S") if paths else np.zeros(0, "S1"))
    pipe = file_pipeline(spec, paths, rs.labels)
    at = 0 if spec.mode == "raw" else 2

    def identify(out: tuple[Any, ...], i: int) -> tuple[str, int, str | None]:
        j = by_path.find(out[at][i].source_info())
        return (rs.ids[j].decode() if j >= 0 else out[at][i].source_info()), int(out[1].at(i)[0]), None

    kw.setdefault("verify_after", spec.verify_after)
    return measure("files", pipe, spec.mode, rs, identify, settings={"reader": "fn.readers.file"}, **kw)


def _webdataset_identify(spec: PipelineSpec) -> Identify:
    meta_at = 2 if spec.mode == "raw" else 3

    def identify(out: tuple[Any, ...], i: int) -> tuple[str, int, str | None]:
        meta = json_meta(out[meta_at].at(i))
        return meta["id"], int(out[1].at(i).tobytes()), meta.get("sha256")

    return identify


def shard_indexes(rs: ReadSet) -> list[str]:
    """The DALI index of each of RS's shards: beside it, or for a refresh's kept tar the index of its live samples."""
    return list(rs.indexes) if rs.indexes else [s[:-4] + ".idx" for s in rs.shards]


_KEPT: list[Any] = []  # pipelines whose process exits without deleting them (run_webdataset's TEARDOWN False)


def run_webdataset(
    name: str,
    rs: ReadSet,
    spec: PipelineSpec,
    base: str,
    readers: int = 1,
    lists: tuple[list[str], list[str]] | None = None,
    teardown: bool = True,
    **kw: Any,
) -> RunResult:
    """fn.readers.webdataset over the split's shards under BASE (a folder or an s3:// prefix), each with the DALI
    index the packer wrote beside it (on S3 too: DALI then reads no tar to find its samples), or over LISTS (paths,
    index paths: imgest.readback.blocks); READERS pipelines, each over its part of the list, read at once as one
    (imgest.readback.parallel) when above 1. TEARDOWN False: its pipelines are kept, not deleted (a process that
    exits at once after it: imgest.readback.dali_s3_process)."""
    kw.setdefault("started", time.perf_counter())
    root = base.rstrip("/")
    paths, index_paths = lists or ([f"{root}/{s}" for s in rs.shards], [f"{root}/{i}" for i in shard_indexes(rs)])
    if readers > 1:
        from imgest.readback.parallel import ParallelPipes

        parts = [webdataset_pipeline(spec, paths, index_paths, shard_id=i, num_shards=readers) for i in range(readers)]
        pipe: Any = ParallelPipes(parts, parts[0].reader_meta(READER)["epoch_size"])  # not padded
        del parts  # the ParallelPipes holds the only references: deleting it below deletes them
    else:
        pipe = webdataset_pipeline(spec, paths, index_paths)
    settings = {
        "reader": "fn.readers.webdataset",
        "shards": len(rs.shards),
        "index_paths": len(index_paths),
        "batch_size": spec.batch_size,
        "readers": readers,
    }
    kw.setdefault("verify_after", spec.verify_after)
    result = measure(name, pipe, spec.mode, rs, _webdataset_identify(spec), settings=settings, **kw)
    if not teardown:
        _KEPT.append(pipe)
        return result
    ended = time.perf_counter()
    del pipe  # here, not when the caller lets go: a pipeline's deletion waits for its prefetched reads (DALI's s3://
    result.teardown_s = round(time.perf_counter() - ended, 3)  # reader: ~1.3 s), part of the reader's time
    return result


def s3_stream_batches(stream: Any) -> Iterator[ExternalBatch]:
    """Batches of imgest's streaming shard reader, with each sample's recorded sha256."""
    for images, labels, keys, metas in stream.epoch_batches():
        yield images, labels, keys, [m.get("sha256") for m in metas]


def webdataset_batches(
    urls: list[str],
    batch_size: int,
    opener: Callable[[str], Any],
    dead: dict[str, frozenset[str]] | None = None,
) -> Iterator[ExternalBatch]:
    """Batches of webdataset.WebDataset streaming s3:// URLS, each opened with OPENER (the peer of our reader),
    without the DEAD samples of each URL (a refresh's kept shards)."""
    import webdataset as wds
    from webdataset.gopen import gopen_schemes

    gopen_schemes["s3"] = lambda url, mode="rb", bufsize=8192, **kw: opener(url)
    batch: list[dict[str, Any]] = []
    dead = dead or {}
    for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        if sample["__key__"] in dead.get(sample["__url__"], ()):
            continue
        batch.append(sample)
        if len(batch) == batch_size:
            yield _wds_columns(batch)
            batch = []
    if batch:
        yield _wds_columns(batch)


def _wds_columns(batch: list[dict[str, Any]]) -> ExternalBatch:
    import json

    metas = [json.loads(s["json"]) for s in batch]
    images = [
        np.frombuffer(
            next(v for k, v in s.items() if k not in ("cls", "json") and not k.startswith("__")), dtype=np.uint8
        )
        for s in batch
    ]
    return (
        images,
        np.array([int(s["cls"]) for s in batch], dtype=np.int32),
        [m["id"] for m in metas],
        [m.get("sha256") for m in metas],
    )
