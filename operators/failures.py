"""Failures that retrying cannot fix end the task at once: Airflow's AirflowFailException skips the retries."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def fail_without_retry() -> Iterator[None]:
    """Re-raise imgest's refused-credential, bad-setting and lost-lock errors as AirflowFailException (same
    message)."""
    from airflow.sdk.exceptions import AirflowFailException

    from imgest.core.errors import AuthenticationError, ConfigError, LockLostError, NothingIngestibleError

    try:
        yield
    except (AuthenticationError, ConfigError, LockLostError, NothingIngestibleError) as exc:
        raise AirflowFailException(str(exc)) from None
