"""The generated sample where every host reaches it: a copy in the run's state store.

A run of the generated sample on hosts that share no disk (Celery workers, pods, Spark workers of their own) reads
it from object storage like any ``s3://`` source: the scan's host generates it (the same spec always gives the
same bytes) and copies what the store lacks to ``<state url>/samples/<dataset>/``; the Spark executors, verify and
the read-back then read it there through the state store's connection.
"""

from __future__ import annotations

import logging
from pathlib import Path

from imgest.core.settings import S3Settings
from imgest.sources.devdata.sample import DEMO_SAMPLE, ensure_sample

log = logging.getLogger(__name__)


def sample_url(state_url: str, dataset: str) -> str:
    """Where DATASET's generated sample lives under STATE_URL (``s3://bucket/prefix``)."""
    return f"{state_url.rstrip('/')}/samples/{dataset}/"


def sample_on_store(local_root: Path, state_url: str, dataset: str, settings: S3Settings) -> str:
    """The sample generated at LOCAL_ROOT (when not there yet), copied to the store under STATE_URL where an object
    is missing or has another size; returns its ``s3://`` URL."""
    url = sample_url(state_url, dataset)
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    root = ensure_sample(local_root, DEMO_SAMPLE)
    client = settings.client()
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    there = {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}
    sent = 0
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        key = prefix + path.relative_to(root).as_posix()
        if there.get(key) != path.stat().st_size:
            client.upload_file(str(path), bucket, key)
            sent += 1
    log.info("generated sample at %s (%d files copied)", url, sent)
    return url
