"""Exception types. Each message names the thing that failed and what to do about it."""


class ImgestError(Exception):
    """Base class for every error imgest reports to a user."""


class ServiceError(ImgestError):
    """An embedded service could not be started, reached or stopped."""


class ConfigError(ImgestError):
    """A setting, flag or Airflow conf value is invalid."""


class AuthenticationError(ImgestError):
    """A store refused the credentials: retrying cannot help, so callers fail at once (no retries)."""


class NothingIngestibleError(ImgestError):
    """Every candidate of a source was quarantined or skipped: there is nothing to store or publish."""


class LockLostError(ImgestError):
    """A run or command no longer holds its dataset's write lock (its lease ran out and another writer took it
    over, or it was released by hand): it must not publish, and retrying cannot give the lock back."""


class NotReadableError(ImgestError):
    """The dataset version a check would read is missing or not finished, or its records cannot be read."""
