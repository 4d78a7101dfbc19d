"""How shards are cut (ShardSpec): importable without numpy or pyarrow, so that validating a request loads neither;
imgest.sinks.shards.plan_cut cuts by it."""

from __future__ import annotations

from dataclasses import dataclass

from imgest.core import defaults
from imgest.core.errors import ConfigError


@dataclass(frozen=True)
class ShardSpec:
    """How to cut shards."""

    max_count: int = defaults.SHARD_MAX_COUNT
    max_bytes: int = defaults.SHARD_MAX_BYTES
    seed: int = defaults.SHUFFLE_SEED

    def __post_init__(self) -> None:
        if self.max_count < 1:
            raise ConfigError(f"shard max count {self.max_count} must be at least 1")
        if self.max_bytes < 64 * 1024:
            raise ConfigError(f"shard max bytes {self.max_bytes} must be at least 64 KiB")
