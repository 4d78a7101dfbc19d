"""What a shard pack task works with: its configuration (PackConfig) and what it reports per shard (ShardRecord)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from imgest.core.errors import ConfigError
from imgest.core.settings import S3Settings
from imgest.sinks.shards.plan import ShardSpec
from imgest.sinks.shards.shard_table import DEAD_COUNT
from imgest.sinks.shards.store_names import version_prefix
from imgest.transform.image import TransformSpec

# What a task needs of a shard's live manifest entry to keep it (its labels, quarantine and dead keys only travel
# with the shards a refresh marks dead rows in: see pack_publish.plan_items).
PUBLISHED_FIELDS = ("name", "split", "samples", "bytes", "sha256", "digest", "path", "index", "info", DEAD_COUNT)
Published = dict[str, Any] | None  # a shard's live entry (PUBLISHED_FIELDS), or None when none is live


@dataclass(frozen=True)
class PackConfig:
    """What every shard task needs. S3 (endpoint, keys) is resolved once by the driver and travels inside the
    pickled task, never in Spark conf, argv or the executors' environment (its repr hides the keys). The live
    manifest's entries are not here: each shard travels with its own (pack_publish.plan_items)."""

    root: str
    dataset: str
    dest: str
    spec: TransformSpec
    shards: ShardSpec
    s3: S3Settings | None = None  # None: a local folder, or the executor's environment
    key: str = ""  # plan.version_key of the run's plan: new shards go under v/<key>/

    def prefix(self) -> str:
        """Where this run's new objects go, relative to the destination: ``v/<key>``."""
        if not self.key:
            raise ConfigError(
                f"no version key for the shards of {self.dataset} at {self.dest}: "
                "set PackConfig.key to plan.version_key(plan, spec)"
            )
        return version_prefix(self.key)


@dataclass
class ShardRecord:
    """One shard as it appears in manifest.json, plus what happened while building it. NAME is the shard's name
    in the plan and samples.parquet; PATH, INDEX and INFO are its objects, relative to the destination."""

    name: str
    split: str
    samples: int
    bytes: int
    sha256: str
    digest: str
    path: str
    index: str
    info: str
    reused: str = ""  # "", "resumed" (written by an interrupted run) or "published" (already live)
    labels: dict[str, int] = field(default_factory=dict)
    quarantine: list[dict[str, Any]] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)  # keys of the tar's samples that are no longer live (sorted)
    carried: bool = False  # labels, quarantine and dead are the live version's: the driver fills them in
