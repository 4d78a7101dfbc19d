"""Failures that retrying cannot fix end the task at once: Airflow's AirflowFailException skips the retries."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def fail_without_retry() -> Iterator[None]:
    """Re-raise imgest's refused-credential, bad-setting and lost-lock errors as AirflowFailException (same
    message)."""
    from imgest.core.errors import AuthenticationError, ConfigError, LockLostError, NothingIngestibleError
    from imgest.operators.compat import fail_exception

    try:
        yield
    except (AuthenticationError, ConfigError, LockLostError, NothingIngestibleError) as exc:
        raise fail_exception()(str(exc)) from None
