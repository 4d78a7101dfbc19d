"""Exception types. Each message names the thing that failed and what to do about it."""


class ImgestError(Exception):
    """Base class for every error imgest reports to a user."""


class ServiceError(ImgestError):
    """An embedded service could not be started, reached or stopped."""


class ConfigError(ImgestError):
    """A setting, flag or Airflow conf value is invalid."""
