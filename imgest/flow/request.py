"""The ingest request behind the `ingest_imagenet` DAG: validated once, before any Spark work starts.

Each field carries its trigger-form description (title, section, JSON-schema bounds), so the DAG's Params are
derived from this one definition (``param_specs``) and cannot drift from it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from imgest.core import defaults
from imgest.core.errors import ConfigError
from imgest.sinks.cassandra.schema import IDENTIFIER, TableLayout, replication
from imgest.sinks.shards.shard_spec import ShardSpec  # light modules: parsing a DAG file loads no numpy, PIL
from imgest.transform.revisions import DECODER_FORM
from imgest.transform.spec import TransformSpec

S3_URL_PATTERN = r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?"
S3_URL = re.compile(f"^{S3_URL_PATTERN}$")
SHARD_DEST_PATTERN = f"^({S3_URL_PATTERN}|/.*)$"
DATASET_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
CONN_ID_PATTERN = "^[A-Za-z0-9_.-]{1,250}$"
DATASET = re.compile(DATASET_PATTERN)
TABLE_SUFFIX_CHARS = "[A-Za-z0-9_]{0,20}"
REPLICATION_PATTERN = r"^(SimpleStrategy:\d+|NetworkTopologyStrategy:[A-Za-z0-9_.-]+=\d+(,[A-Za-z0-9_.-]+=\d+)*)$"
_NUMBERS = r"\s*\d+(\.\d+)?(\s*,\s*\d+(\.\d+)?)*\s*"
RATIOS_PATTERN = f"^{_NUMBERS}$"
BALANCE_PATTERN = f"^(original|random|{_NUMBERS})$"
SECTIONS = ("Source", "Target", "Transform", "Cassandra", "Shards", "Files", "Splits", "Checks", "Spark")


def _param(default: Any, title: str, section: str, description: str = "", **schema: Any) -> Any:
    """A dataclass field whose metadata describes its trigger-form Param."""
    meta = {"title": title, "section": section, "description": description, **schema}
    return field(default=default, metadata={"param": meta})


@dataclass(frozen=True)
class IngestRequest:
    """Every setting of one ingest run (the DAG's Params, typed)."""

    source: str | None = _param(
        None,
        "Source dataset",
        "Source",
        "A folder the Airflow worker and every Spark node can read (ImageNet CLS-LOC, ImageFolder train/val, or "
        "class folders) or ILSVRC2012_img_train.tar; or the same on S3: s3://bucket/prefix/ or "
        "s3://bucket/.../ILSVRC2012_img_train.tar (read with Source connection, no shared file system needed). "
        "Give this or switch on 'Use the generated sample', not both.",
        type=["null", "string"],
    )
    source_conn_id: str = _param(
        "aws_default",
        "Source connection",
        "Source",
        "Required. The Airflow connection (Amazon Web Services) whose keys, endpoint and region read an s3:// "
        "source; the destination keeps its own (aws_default). Ignored for a local source.",
        pattern=CONN_ID_PATTERN,
    )
    sample: bool = _param(
        False,
        "Use the generated sample",
        "Source",
        "On: ingest imgest's generated sample (10 classes in the CLS-LOC layout, with planted bad files) and leave "
        "Source dataset empty. Never chosen implicitly: with neither, validate fails.",
    )
    layout: str = _param(
        defaults.LAYOUT,
        "Layout",
        "Source",
        "How the source is organised; auto detects it from the folder or tar.",
        enum=list(defaults.LAYOUTS),
        values_display={
            "auto": "auto (detect)",
            "cls-loc": "cls-loc (ILSVRC/Data/CLS-LOC/train|val, Kaggle tree)",
            "imagefolder": "imagefolder (train/ and val/ holding class folders)",
            "flat": "flat (class folders only, one split)",
            "tar": "tar (ILSVRC2012_img_train.tar of per-class tars, + ILSVRC2012_img_val.tar and LOC_val_solution.csv "
            "beside it; read in place)",
        },
    )
    dataset: str = _param(
        defaults.DATASET,
        "Dataset name",
        "Source",
        "Required. Names the work folder, the image ids and the version record (and the default shard prefix): "
        "letters, digits, _ . - ; first a letter or digit; at most 64.",
        pattern=DATASET_PATTERN,
    )
    target: str = _param(
        defaults.TARGET,
        "Target",
        "Target",
        "Where the images go. cassandra: tables in the Keyspace below (connection cassandra_default); shards: "
        "webdataset tars with DALI indexes at the Shard destination (connection aws_default, or a folder); files: "
        "<split>/<wnid>/<id>.jpg under the Files destination, the tree DALI fn.readers.file reads.",
        enum=list(defaults.TARGETS),
        values_display={
            "cassandra": "cassandra (data + metadata tables, cassandra-dali-plugin layout)",
            "shards": "shards (webdataset .tar + DALI .idx on S3 or a folder)",
            "files": "files (<split>/<wnid>/<id>.jpg, the tree fn.readers.file reads)",
        },
    )
    keep_versions: int = _param(
        defaults.KEEP_VERSIONS,
        "Earlier versions kept",
        "Target",
        "Required, 0 or more (shards and files targets): after publishing, the gc task deletes the stored versions "
        "older than the one just published and this many before it (0: only the current one). Readers of a deleted "
        "version fail: keep as many as may still be read.",
        minimum=0,
    )
    image_mode: str = _param(
        defaults.IMAGE_MODE,
        "Image mode",
        "Transform",
        "jpeg: resize, center-crop and re-encode every image; unchanged: store the original bytes (checked to "
        "decode), Resize, Crop and Quality are then ignored.",
        enum=list(defaults.IMAGE_MODES),
        values_display={"jpeg": "jpeg (resize, crop, re-encode)", "unchanged": "unchanged (original bytes)"},
    )
    resize: int = _param(
        defaults.RESIZE,
        "Resize shorter side to",
        "Transform",
        "Required, pixels, 8 to 4096. The shorter side is scaled to this before the center crop.",
        minimum=8,
        maximum=4096,
    )
    crop: int = _param(
        defaults.CROP,
        "Center-crop size",
        "Transform",
        "Required, pixels, 8 to 4096 and at most the resize (a larger crop fails validate before any Spark work).",
        minimum=8,
        maximum=4096,
    )
    quality: int = _param(
        defaults.QUALITY, "JPEG quality", "Transform", "Required, 1 to 100 (jpeg mode).", minimum=1, maximum=100
    )
    unchanged_check: str = _param(
        defaults.UNCHANGED_CHECK,
        "Check of unchanged images",
        "Transform",
        "unchanged mode: decode every file (1/8 scale; the default) or parse the header and find the JPEG/PNG end "
        "marker without decoding pixels (several times faster; a file corrupt in the middle passes).",
        enum=list(defaults.UNCHANGED_CHECKS),
    )
    jpeg_decoder: str = _param(
        "auto",
        "JPEG decoder",
        "Transform",
        "auto: fast where built, else pillow. fast: imgest's compiled decoder, only the crop's region decoded, "
        "Pillow's bicubic kernel. fast-bilinear: the same, bilinear like torchvision. pillow: Pillow's decode and "
        "resize. The version records the revision (fast = region4, fast-bilinear = region3).",
        enum=list(DECODER_FORM),
        values_display=DECODER_FORM,
    )
    keyspace: str = _param(
        defaults.KEYSPACE,
        "Keyspace",
        "Cassandra",
        "Required for the cassandra target: a letter first, then letters, digits or _ ; at most 48. Created if "
        "missing.",
        pattern=IDENTIFIER.pattern,
    )
    table_layout: str = _param(
        defaults.TABLE_LAYOUT,
        "Table layout",
        "Cassandra",
        "split-column: one data/metadata table pair with a split column; per-split: data_train, metadata_train, ...",
        enum=list(defaults.TABLE_LAYOUTS),
    )
    table_suffix: str | None = _param(
        None,
        "Table suffix",
        "Cassandra",
        "Optional: appended to the table names, e.g. _orig for unchanged images beside jpeg ones. Letters, digits "
        "and _ ; at most 20.",
        type=["null", "string"],
        pattern=f"^{TABLE_SUFFIX_CHARS}$",
    )
    replication: str = _param(
        defaults.REPLICATION,
        "Keyspace replication",
        "Cassandra",
        "Required: SimpleStrategy:N, or NetworkTopologyStrategy:dc1=N,dc2=M (used when the keyspace is created).",
        pattern=REPLICATION_PATTERN,
    )
    write_path: str = _param(
        defaults.WRITE_PATH,
        "Write path",
        "Cassandra",
        "cql: an UNLOGGED batch per image through the Python driver. cql-helper: the same batch sent by the helper's "
        "Java driver (less client CPU per row; Java on the executors). bulk: the Spark executors write SSTables and "
        "stream them to every replica (Cassandra 5; Java on the executors, the helper built once with Maven). auto: "
        f"from {defaults.BULK_MIN_ROWS} rows bulk where the cluster can take it (Cassandra 5), else cql-helper where "
        "Java is found; cql below that. The summary says which and why.",
        enum=list(defaults.WRITE_PATHS),
    )
    s3_dest: str | None = _param(
        None,
        "Shard destination",
        "Shards",
        "Optional: s3://bucket/prefix (connection aws_default) or an absolute folder. Empty: s3://<bucket>/<dataset>, "
        "the bucket from the connection's extra bucket or IMGEST_S3_BUCKET (no bucket is a default).",
        type=["null", "string"],
        pattern=SHARD_DEST_PATTERN,
    )
    shard_max_count: int = _param(
        defaults.SHARD_MAX_COUNT, "Samples per shard, at most", "Shards", "Required, at least 1.", minimum=1
    )
    shard_max_bytes: int = _param(
        defaults.SHARD_MAX_BYTES,
        "Bytes per shard, at most",
        "Shards",
        "Required, at least 65536 (64 KiB); 1073741824 is 1 GiB.",
        minimum=65536,
    )
    shuffle_seed: int = _param(
        defaults.SHUFFLE_SEED,
        "Shuffle seed",
        "Shards",
        "Required, 0 or more: the same input and seed give byte-identical shards.",
        minimum=0,
    )
    files_dest: str | None = _param(
        None,
        "Files destination",
        "Files",
        "Optional: an absolute folder for the files target, on storage every Spark node sees; empty = "
        "<IMGEST_HOME>/files/<dataset>.",
        type=["null", "string"],
        pattern="^/.*$",
    )
    split_ratios: str = _param(
        defaults.SPLIT_RATIOS,
        "Split ratios",
        "Splits",
        "Required: positive numbers separated by commas, one per part of split-<target>.npz, e.g. 8,2 or 7,2,1.",
        pattern=RATIOS_PATTERN,
    )
    split_balance: str = _param(
        defaults.SPLIT_BALANCE,
        "Class balance",
        "Splits",
        "Required: original (every image), random (seeded class weights), or one weight per class, comma separated.",
        pattern=BALANCE_PATTERN,
        examples=["original", "random"],
    )
    split_seed: int = _param(
        defaults.SPLIT_SEED,
        "Split seed",
        "Splits",
        "Required, 0 or more: the same seed gives the same split.",
        minimum=0,
    )
    read_check: bool = _param(
        True,
        "Read-back check",
        "Checks",
        "On: after the split, read a sample of the stored train rows (Images checked) back through DALI with every "
        "reader of the target and check every byte and label against the ingest record (read_throughput.json in "
        "the work folder).",
    )
    check_sample: int = _param(
        defaults.CHECK_SAMPLE,
        "Images checked",
        "Checks",
        "Required, 0 or more: the read-back and xNVMe checks read a seeded, class-balanced sample of this many train "
        "images (the report gives its size); 0 reads every row, which at ImageNet's count takes hours.",
        minimum=0,
    )
    check_seconds: int = _param(
        defaults.CHECK_SECONDS,
        "Read-back seconds",
        "Checks",
        f"Required, 0 or more: the read-back check's time budget (from {defaults.CHECK_SHARE_FROM_IMAGES:,} train "
        f"images on at most {defaults.CHECK_RUN_SHARE:.0%} of the run); each reader reads its warm-up and window "
        "batches, then on until its rate is steady or its share is spent; the report shows start-up and steady "
        "rate apart. 0: no budget (every reader reads the whole sample).",
        minimum=0,
    )
    xnvme_loop_fs: str | None = _param(
        defaults.XNVME_LOOP_FS,
        "xNVMe check filesystem",
        "Checks",
        "Files target only: copy the files onto a fresh loop-mounted ext4 or xfs image so xNVMe's block engine can "
        "read them by LBA (needs root; otherwise that engine is skipped with the reason); empty = read in place.",
        type=["null", "string"],
        enum=[None, "ext4", "xfs"],
    )
    spark_partitions: int = _param(
        defaults.SPARK_PARTITIONS,
        "Spark partitions",
        "Spark",
        "Required, 0 or more: 0 lets the job choose from the manifest size and the cores of spark_default.",
        minimum=0,
    )

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
            (
                bool(self.source) != self.sample,
                "give a source (Source dataset) or set sample: true (Use the generated sample), not both",
            ),
            (self.target in defaults.TARGETS, f"target {self.target!r} must be one of {', '.join(defaults.TARGETS)}"),
            (bool(DATASET.match(self.dataset)), f"dataset {self.dataset!r}: letters, digits, _ . - (<= 64)"),
            (self.layout in defaults.LAYOUTS, f"layout {self.layout!r} is unknown"),
            (
                not (self.source or "").startswith("s3://") or bool(S3_URL.match(self.source or "")),
                f"source {self.source!r} is not an S3 URL: write s3://bucket/prefix/ or s3://bucket/key.tar",
            ),
            (
                bool(re.match(CONN_ID_PATTERN, self.source_conn_id)),
                f"source_conn_id {self.source_conn_id!r}: an Airflow connection id (letters, digits, _ . -)",
            ),
            (self.spark_partitions >= 0, "spark_partitions must be 0 (auto) or more"),
            (self.check_sample >= 0, "check_sample must be 0 (every row) or more"),
            (self.check_seconds >= 0, "check_seconds must be 0 (no budget) or more"),
            (self.keep_versions >= 0, "keep_versions must be 0 (only the current version) or more"),
        ]
        errors += [message for ok, message in checks if not ok]
        for build in (self.transform, self.shards, self.tables, lambda: replication(self.replication)):
            try:
                build()
            except ConfigError as exc:
                errors.append(str(exc))
        if self.target == "shards":
            errors += _dest_problems(self)
        if self.files_dest and not self.files_dest.startswith("/"):
            errors.append(f"files_dest {self.files_dest!r} must be an absolute folder")
        try:
            ratios = [float(r) for r in self.split_ratios.split(",")]
            if len(ratios) < 1 or any(r <= 0 for r in ratios):
                raise ValueError
        except ValueError:
            errors.append(f"split_ratios {self.split_ratios!r} must be positive numbers separated by commas")
        return errors

    @property
    def shard_dest(self) -> str:
        """s3_dest, else s3://$IMGEST_S3_BUCKET/<dataset> (``validate_conf`` writes it into the run's request)."""
        return self.s3_dest or defaults.shard_dest(self.dataset)

    @property
    def files_location(self) -> str:
        """The files target's folder, defaulting to <state>/files/<dataset>."""
        return self.files_dest or defaults.files_dest(self.dataset)

    @property
    def location(self) -> str:
        """Where the target of this request stores the dataset."""
        where = {"cassandra": lambda: self.tables().keyspace, "shards": lambda: self.shard_dest}
        return where.get(self.target, lambda: self.files_location)()

    def transform(self) -> TransformSpec:
        check = {"unchanged_check": self.unchanged_check, "jpeg_decoder": self.jpeg_decoder}  # the spec resolves it
        return TransformSpec(self.image_mode.lower(), self.resize, self.crop, self.quality, **check)

    def shards(self) -> ShardSpec:
        return ShardSpec(self.shard_max_count, self.shard_max_bytes, self.shuffle_seed)

    def tables(self) -> TableLayout:
        return TableLayout(self.keyspace, self.table_layout, self.table_suffix or "")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _dest_problems(request: IngestRequest) -> list[str]:
    """Why REQUEST's shard destination cannot be used (s3://bucket/prefix or an absolute folder; none resolved)."""
    from imgest.sinks.shards.store import dest_problem

    try:
        dest = request.shard_dest
    except ConfigError as exc:
        return [str(exc)]
    if not (S3_URL.match(dest) or dest.startswith("/")):
        return [f"s3_dest {dest!r} must be s3://bucket/prefix or an absolute folder"]
    problem = dest_problem(dest)
    return [f"s3_dest: {problem}"] if problem else []
