"""The run's source connection, registered in every task that may read the source (scan, verify, refresh plan,
read-back), so no task reads an ``s3://`` source with whatever its host's environment holds."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def register_run_source(source: str | None, source_conn_id: str | None) -> bool:
    """Register SOURCE_CONN_ID's settings for SOURCE in this task's process when SOURCE is on S3; True if it did."""
    if not source or not str(source).startswith("s3://") or not source_conn_id:
        return False
    from imgest.operators.hooks import source_settings
    from imgest.sources.s3source import register_source

    settings = source_settings(str(source), str(source_conn_id))
    if settings is None:
        return False
    register_source(str(source), settings)
    log.info("source %s read through the Airflow connection %r", source, source_conn_id)
    return True


def register_request_source(request: dict[str, Any], default_conn_id: str = "") -> bool:
    """register_run_source for a run's REQUEST (``source`` and ``source_conn_id``)."""
    return register_run_source(request.get("source"), request.get("source_conn_id") or default_conn_id)
