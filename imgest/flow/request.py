"""The ingest request behind the `ingest_imagenet` DAG: validated once, before any Spark work starts.

Each field carries its trigger-form description (title, section, JSON-schema bounds), so the DAG's Params are
derived from this one definition (``param_specs``) and cannot drift from it.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from typing import Any

from imgest.core import defaults
from imgest.core.errors import ConfigError
from imgest.sinks.cassandra.schema import TableLayout, replication
from imgest.sinks.shards.plan import ShardSpec
from imgest.transform.image import TransformSpec

S3_URL = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?$")
DATASET_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
DATASET = re.compile(DATASET_PATTERN)
SECTIONS = ("Source", "Target", "Transform", "Cassandra", "Shards", "Splits", "Spark")


def _param(default: Any, title: str, section: str, description: str = "", **schema: Any) -> Any:
    """A dataclass field whose metadata describes its trigger-form Param."""
    meta = {"title": title, "section": section, "description": description, **schema}
    return field(default=default, metadata={"param": meta})


def _schema_type(value: Any) -> str:
    return {bool: "boolean", int: "integer", str: "string"}[type(value)]


@dataclass(frozen=True)
class IngestRequest:
    """Every setting of one ingest run (the DAG's Params, typed)."""

    source: str | None = _param(
        None,
        "Source dataset",
        "Source",
        "Folder (ImageNet CLS-LOC, ImageFolder train/val, class folders) or ILSVRC2012_img_train.tar, as seen by "
        "the Airflow worker. Required unless 'Use the generated sample' is on.",
        type=["null", "string"],
    )
    sample: bool = _param(
        False,
        "Use the generated sample",
        "Source",
        "Ingest imgest's generated sample dataset (10 classes, with planted bad files) instead of a source. "
        "Never chosen implicitly.",
    )
    layout: str = _param(defaults.LAYOUT, "Layout", "Source", "auto detects it", enum=list(defaults.LAYOUTS))
    dataset: str = _param(
        "imagenet-sample",
        "Dataset name",
        "Source",
        "Used in image ids, the work folder and version records: letters, digits, _ . - (at most 64)",
        pattern=DATASET_PATTERN,
    )
    target: str = _param(
        "cassandra",
        "Target",
        "Target",
        "cassandra: data + metadata tables (cassandra-dali-plugin layout); shards: webdataset tars with DALI indexes",
        enum=list(defaults.TARGETS),
    )
    image_mode: str = _param(
        defaults.IMAGE_MODE,
        "Image mode",
        "Transform",
        "jpeg: resize + center-crop + re-encode; unchanged: the original bytes (checked to decode)",
        enum=list(defaults.IMAGE_MODES),
    )
    resize: int = _param(
        defaults.RESIZE, "Resize shorter side to", "Transform", "8 to 4096 pixels", minimum=8, maximum=4096
    )
    crop: int = _param(
        defaults.CROP, "Center-crop size", "Transform", "8 to 4096, at most the resize", minimum=8, maximum=4096
    )
    quality: int = _param(defaults.QUALITY, "JPEG quality", "Transform", "1 to 100", minimum=1, maximum=100)
    keyspace: str = _param(
        defaults.KEYSPACE,
        "Keyspace",
        "Cassandra",
        "Letter first, then letters, digits or _ (at most 48)",
        pattern="^[A-Za-z][A-Za-z0-9_]{0,47}$",
    )
    table_layout: str = _param(
        defaults.TABLE_LAYOUT,
        "Table layout",
        "Cassandra",
        "split-column: one data/metadata pair with a split column; per-split: data_<split> tables",
        enum=list(defaults.TABLE_LAYOUTS),
    )
    table_suffix: str | None = _param(
        None,
        "Table suffix",
        "Cassandra",
        "Optional, appended to table names, e.g. _orig for UNCHANGED images (letters, digits, _; at most 20)",
        type=["null", "string"],
        pattern="^[A-Za-z0-9_]{0,20}$",
    )
    replication: str = _param(
        defaults.REPLICATION,
        "Keyspace replication",
        "Cassandra",
        "SimpleStrategy:N or NetworkTopologyStrategy:dc1=N,dc2=M",
        pattern=r"^(SimpleStrategy:\d+|NetworkTopologyStrategy:[A-Za-z0-9_.-]+=\d+(,[A-Za-z0-9_.-]+=\d+)*)$",
    )
    s3_dest: str | None = _param(
        None,
        "Shard destination",
        "Shards",
        "s3://bucket/prefix (connection aws_default) or an absolute folder; empty = s3://imgest/<dataset>",
        type=["null", "string"],
    )
    shard_max_count: int = _param(defaults.SHARD_MAX_COUNT, "Samples per shard, at most", "Shards", minimum=1)
    shard_max_bytes: int = _param(
        defaults.SHARD_MAX_BYTES, "Bytes per shard, at most", "Shards", "at least 65536", minimum=65536
    )
    shuffle_seed: int = _param(defaults.SHUFFLE_SEED, "Shuffle seed", "Shards", "same input and seed, same shards")
    split_ratios: str = _param(
        defaults.SPLIT_RATIOS,
        "Split ratios",
        "Splits",
        "Positive numbers separated by commas, e.g. 8,2 or 7,2,1",
        pattern=r"^\s*\d+(\.\d+)?(\s*,\s*\d+(\.\d+)?)*\s*$",
    )
    split_balance: str = _param(
        defaults.SPLIT_BALANCE, "Class balance", "Splits", "original, random, or one weight per class (comma separated)"
    )
    split_seed: int = _param(defaults.SPLIT_SEED, "Split seed", "Splits")
    spark_partitions: int = _param(defaults.SPARK_PARTITIONS, "Spark partitions", "Spark", "0 = automatic", minimum=0)

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
            (bool(self.source) != self.sample, "give a source, or set sample to use the generated sample (not both)"),
            (self.target in defaults.TARGETS, f"target {self.target!r} must be one of {', '.join(defaults.TARGETS)}"),
            (bool(DATASET.match(self.dataset)), f"dataset {self.dataset!r}: letters, digits, _ . - (<= 64)"),
            (self.layout in defaults.LAYOUTS, f"layout {self.layout!r} is unknown"),
            (self.spark_partitions >= 0, "spark_partitions must be 0 (auto) or more"),
        ]
        errors += [message for ok, message in checks if not ok]
        for build in (self.transform, self.shards, self.tables, lambda: replication(self.replication)):
            try:
                build()
            except ConfigError as exc:
                errors.append(str(exc))
        if self.target == "shards":
            errors += _dest_problems(self.shard_dest)
        try:
            ratios = [float(r) for r in self.split_ratios.split(",")]
            if len(ratios) < 1 or any(r <= 0 for r in ratios):
                raise ValueError
        except ValueError:
            errors.append(f"split_ratios {self.split_ratios!r} must be positive numbers separated by commas")
        return errors

    @property
    def shard_dest(self) -> str:
        """The shard destination, defaulting to s3://imgest/<dataset>."""
        return self.s3_dest or defaults.shard_dest(self.dataset)

    def transform(self) -> TransformSpec:
        return TransformSpec(self.image_mode.lower(), self.resize, self.crop, self.quality)

    def shards(self) -> ShardSpec:
        return ShardSpec(self.shard_max_count, self.shard_max_bytes, self.shuffle_seed)

    def tables(self) -> TableLayout:
        return TableLayout(self.keyspace, self.table_layout, self.table_suffix or "")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _dest_problems(dest: str) -> list[str]:
    """Why the shard destination DEST cannot be used (s3://bucket/prefix or an absolute folder)."""
    from imgest.sinks.shards.store import dest_problem

    if not (S3_URL.match(dest) or dest.startswith("/")):
        return [f"s3_dest {dest!r} must be s3://bucket/prefix or an absolute folder"]
    problem = dest_problem(dest)
    return [f"s3_dest: {problem}"] if problem else []


def _param_spec(f: Field) -> dict[str, Any]:
    meta = dict(f.metadata["param"])
    default = f.default if f.default is not MISSING else None
    if "type" not in meta and "enum" not in meta:
        meta["type"] = _schema_type(default)
    if not meta.get("description"):
        meta.pop("description")
    return {"default": default, **meta}


def param_specs() -> dict[str, dict[str, Any]]:
    """Keyword arguments of an Airflow ``Param`` for every request field, in form order."""
    return {f.name: _param_spec(f) for f in fields(IngestRequest)}
