"""A dataset's work folder kept in object storage, so each task of a run may start on an empty disk.

The DAGs' tasks pass a dataset's work folder (``$IMGEST_HOME/work/<dataset>/``: the manifest, class map, scan
report, quarantine records, shard plan, job summaries, split files, read-back and validation reports, the
refresh baseline and state) from one task to the next. With ``$IMGEST_STATE_URL`` (``s3://bucket/prefix``) set,
that folder's copy of record is ``prefix/work/<dataset>/``: a task first *pulls* what it does not have yet
(or what another task changed since), works on local files as before, and *pushes* what it wrote or changed,
deleting in the store what it removed. Each file moves whole and streams to or from disk (never into memory);
unchanged files are neither downloaded nor uploaded again (sizes, mtimes and ETags recorded in ``.workarea.json``
beside them). Spark executors do not use this: they read the job's files from the store directly
(``imgest.core.staging``).

``$IMGEST_WORKAREA_EPHEMERAL=1`` removes the local folder before each task (``operators/workarea.py``): a task
never sees what an earlier task left on its disk, as a pod on a fresh disk would not (the no-shared-disk test
harness; with it and no state URL, a task that needs an earlier task's file fails naming it).
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from imgest.core.settings import S3Settings

log = logging.getLogger(__name__)
INDEX = ".workarea.json"
EPHEMERAL_ENV = "IMGEST_WORKAREA_EPHEMERAL"


class WorkArea:
    """The work folder LOCAL of DATASET and its copy under STATE_URL/work/DATASET/."""

    def __init__(self, local: Path, dataset: str, state_url: str, s3: S3Settings) -> None:
        bucket, _, prefix = state_url.removeprefix("s3://").partition("/")
        self.local, self.bucket = local, bucket
        self.prefix = f"{prefix.strip('/')}/work/{dataset}/".lstrip("/")
        self.client = s3.client()

    def _index(self) -> dict[str, dict[str, Any]]:
        try:
            return json.loads((self.local / INDEX).read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def _save(self, index: dict[str, dict[str, Any]]) -> None:
        (self.local / INDEX).write_text(json.dumps(index, sort_keys=True))

    def _remote(self) -> dict[str, tuple[str, int]]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
        return {o["Key"][len(self.prefix) :]: (o["ETag"], o["Size"]) for p in pages for o in p.get("Contents", [])}

    def _local(self) -> dict[str, os.stat_result]:
        if not self.local.is_dir():
            return {}
        return {
            p.relative_to(self.local).as_posix(): p.stat()
            for p in self.local.rglob("*")
            if p.is_file() and p.name != INDEX and not p.name.endswith((".tmp", ".partial"))
        }

    def pull(self, reads: Sequence[str] | None = None) -> int:
        """Download every file of the store's copy this folder lacks or holds in another version (only those whose
        relative path matches one of the glob patterns READS when given: what the task reads), and remove here
        what another task deleted there since this folder last saw it; returns how many files were downloaded."""
        index, here, fetched = self._index(), self._local(), 0
        remote = self._remote()
        for rel in [r for r in index if r not in remote]:  # deleted in the store by a task elsewhere
            (self.local / rel).unlink(missing_ok=True)
            del index[rel]
        if reads is not None:
            remote = {rel: v for rel, v in remote.items() if any(fnmatch.fnmatchcase(rel, p) for p in reads)}
        for rel, (etag, _size) in remote.items():
            known = index.get(rel)
            st = here.get(rel)
            if st is not None and known and known["etag"] == etag and _same(st, known):
                continue
            path = self.local / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.tmp")  # its own: no other pull writes it
            try:
                self.client.download_file(self.bucket, self.prefix + rel, str(tmp))
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)  # a download cut short leaves nothing behind
            st = path.stat()
            index[rel] = {"etag": etag, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
            fetched += 1
        if self.local.is_dir():
            self._save(index)
        return fetched

    def push(self) -> tuple[int, int]:
        """Upload the files written or changed here since the last pull or push, delete in the store those removed
        here; returns (uploaded, deleted)."""
        index, here = self._index(), self._local()
        sent = 0
        for rel, st in sorted(here.items()):
            known = index.get(rel)
            if known and _same(st, known):
                continue
            self.client.upload_file(str(self.local / rel), self.bucket, self.prefix + rel)
            etag = self.client.head_object(Bucket=self.bucket, Key=self.prefix + rel)["ETag"]
            index[rel] = {"etag": etag, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
            sent += 1
        gone = [rel for rel in index if rel not in here]
        for rel in gone:
            self.client.delete_object(Bucket=self.bucket, Key=self.prefix + rel)
            del index[rel]
        if self.local.is_dir():
            self._save(index)
        return sent, len(gone)


def _same(st: os.stat_result, known: dict[str, Any]) -> bool:
    return st.st_size == known["size"] and st.st_mtime_ns == known["mtime_ns"]


def work_area(dataset: str, s3: S3Settings | None = None) -> WorkArea | None:
    """DATASET's work area in the store named by ``$IMGEST_STATE_URL``, or None when that is unset."""
    from imgest.core.lock_stores import state_url
    from imgest.core.workdir import dataset_workdir

    url = state_url()
    if url is None or not dataset:
        return None
    return WorkArea(dataset_workdir(dataset), dataset, url, s3 or S3Settings.from_env())


def ephemeral() -> bool:
    return os.environ.get(EPHEMERAL_ENV, "").strip() in ("1", "true", "yes")


def shared_location(path: Path) -> str:
    """How a record read on other hosts names PATH, a file of a dataset's work folder: its copy in the state store
    (``s3://.../work/<dataset>/...``) when the run state lives there, else the local path."""
    from imgest.core.lock_stores import state_url
    from imgest.core.paths import state_dir

    url = state_url()
    if url is None:
        return str(path)
    try:
        rel = path.resolve().relative_to((state_dir() / "work").resolve())
    except ValueError:  # not in a work folder: nothing else has a copy
        return str(path)
    return f"{url.rstrip('/')}/work/{rel.as_posix()}"
