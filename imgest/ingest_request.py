"""The ingest request behind the `ingest_imagenet` DAG: validated once, before any Spark work starts."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import Any

from imgest.cassandra_schema import TableLayout, replication
from imgest.errors import ConfigError
from imgest.shard_plan import ShardSpec
from imgest.transform import TransformSpec

S3_URL = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?$")
DATASET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class IngestRequest:
    """Every setting of one ingest run (the DAG's Params, typed)."""

    source: str = ""
    layout: str = "auto"
    dataset: str = "imagenet-sample"
    target: str = "cassandra"
    image_mode: str = "jpeg"
    resize: int = 256
    crop: int = 224
    quality: int = 90
    keyspace: str = "imgest"
    table_layout: str = "split-column"
    table_suffix: str = ""
    replication: str = "SimpleStrategy:1"
    s3_dest: str = "s3://imgest/imagenet-sample"
    shard_max_count: int = 5000
    shard_max_bytes: int = 1 << 30
    shuffle_seed: int = 0
    split_ratios: str = "8,2"
    split_balance: str = "original"
    split_seed: int = 0
    spark_partitions: int = 0

    @classmethod
    def from_conf(cls, conf: dict[str, Any]) -> IngestRequest:
        """Build and validate; unknown keys and every invalid value are reported together."""
        known = {f.name for f in fields(cls)}
        errors = [f"unknown setting {k!r}" for k in sorted(set(conf) - known)]
        try:
            request = cls(**{k: v for k, v in conf.items() if k in known})
        except TypeError as exc:
            raise ConfigError(f"invalid ingest settings: {exc}") from None
        errors += request.problems()
        if errors:
            raise ConfigError("invalid ingest settings: " + "; ".join(errors))
        return request

    def problems(self) -> list[str]:
        """Every reason this request cannot run (empty when it can)."""
        errors: list[str] = []
        checks = [
            (self.target in ("cassandra", "shards"), f"target {self.target!r} must be 'cassandra' or 'shards'"),
            (bool(DATASET.match(self.dataset)), f"dataset {self.dataset!r}: letters, digits, _ . - (<= 64)"),
            (self.layout in ("auto", "cls-loc", "imagefolder", "flat", "tar"), f"layout {self.layout!r} is unknown"),
            (self.spark_partitions >= 0, "spark_partitions must be 0 (auto) or more"),
        ]
        errors += [message for ok, message in checks if not ok]
        for build in (self.transform, self.shards, self.tables, lambda: replication(self.replication)):
            try:
                build()
            except ConfigError as exc:
                errors.append(str(exc))
        if self.target == "shards" and not (S3_URL.match(self.s3_dest) or self.s3_dest.startswith("/")):
            errors.append(f"s3_dest {self.s3_dest!r} must be s3://bucket/prefix or an absolute folder")
        try:
            ratios = [float(r) for r in self.split_ratios.split(",")]
            if len(ratios) < 1 or any(r <= 0 for r in ratios):
                raise ValueError
        except ValueError:
            errors.append(f"split_ratios {self.split_ratios!r} must be positive numbers separated by commas")
        return errors

    def transform(self) -> TransformSpec:
        return TransformSpec(self.image_mode.lower(), self.resize, self.crop, self.quality)

    def shards(self) -> ShardSpec:
        return ShardSpec(self.shard_max_count, self.shard_max_bytes, self.shuffle_seed)

    def tables(self) -> TableLayout:
        return TableLayout(self.keyspace, self.table_layout, self.table_suffix)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
