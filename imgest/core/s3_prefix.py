"""Removing everything under one prefix of a bucket (a run's results, a benchmark's output)."""

from __future__ import annotations

from typing import Any


def delete_prefix(client: Any, bucket: str, prefix: str) -> int:
    """Delete every object of BUCKET whose key starts with PREFIX, a page (up to 1,000 keys) per request, through
    the boto3 CLIENT; returns how many there were."""
    deleted = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
            deleted += len(keys)
    return deleted
