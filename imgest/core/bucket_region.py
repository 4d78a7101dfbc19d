"""The region a bucket lives in, asked of the bucket itself, for clients that sign for one region and never follow.

boto3 follows S3's answer to a request signed for the wrong region (AuthorizationHeaderMalformed, a 301, a HEAD's
bare 400, each naming the bucket's region in ``x-amz-bucket-region``). Arrow's S3 filesystem, DALI's AWS SDK and
imgest's own signed GETs do not: they sign for the region they are given. ``for_bucket`` gives them the bucket's
region, asked once per process and bucket by a HeadBucket through boto3 (which reads that header from any answer,
an AccessDenied one included); a store that names no region keeps the connection's.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Any

log = logging.getLogger(__name__)
REGION_HEADER = "x-amz-bucket-region"
_regions: dict[tuple[str, str], str] = {}
_lock = threading.Lock()


def _answered_region(answer: dict[str, Any]) -> str | None:
    """The bucket region an S3 answer (a response dict, or a ClientError's) names, None when it names none."""
    headers = answer.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    return headers.get(REGION_HEADER) or answer.get("Error", {}).get("Region") or None


def bucket_region(settings: Any, bucket: str) -> str:
    """The region of BUCKET on SETTINGS' store (asked once per process), else SETTINGS' own region."""
    from botocore.exceptions import BotoCoreError, ClientError

    key = (settings.endpoint_url or "aws", bucket)
    with _lock:
        if key in _regions:
            return _regions[key]
    try:
        region = _answered_region(settings.client().head_bucket(Bucket=bucket))
    except ClientError as exc:  # a refused HeadBucket still names the region on AWS
        region = _answered_region(exc.response)
    except BotoCoreError as exc:
        log.debug("the region of bucket %s could not be asked (%s); using %s", bucket, exc, settings.region)
        return str(settings.region)
    region = region or str(settings.region)
    if region != settings.region:
        log.info("bucket %s is in %s (the connection says %s): signing for %s", bucket, region, settings.region, region)
    with _lock:
        _regions[key] = region
    return region


def for_bucket(settings: Any, bucket: str) -> Any:
    """SETTINGS signing for BUCKET's region (the same object when that is already its region)."""
    region = bucket_region(settings, bucket)
    return settings if region == settings.region else replace(settings, region=region)


def region_of_refusal(status: int, headers: Any, body: bytes) -> str | None:
    """The region S3 names in a refusal of a request signed for another one (for signers that do not follow): a
    400 AuthorizationHeaderMalformed, a 301 PermanentRedirect or a HEAD's bare 400, by header or ``<Region>``."""
    if status not in (301, 400):
        return None
    region = headers.get(REGION_HEADER)
    if not region and b"<Region>" in body:
        region = body.split(b"<Region>", 1)[1].split(b"</Region>", 1)[0].decode(errors="replace")
    return region or None


def forget_regions() -> None:
    """Forget the regions asked so far (a long-lived process between jobs)."""
    with _lock:
        _regions.clear()
