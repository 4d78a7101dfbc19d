"""Scanning a source on S3 into the same manifest as a local scan: the same layouts, labels, ids and rules.

``s3://bucket/prefix/`` may hold any folder layout (CLS-LOC, ImageFolder, flat class folders) or ImageNet's
archives; ``s3://bucket/.../ILSVRC2012_img_train.tar`` names the train tar itself (the val tar and
``LOC_val_solution.csv`` are looked up beside it). Folders are listed with ListObjectsV2, page by page, and
candidates stream into the manifest with their key (relative to the data root), size, ETag and label; the
tars' member index is built by streaming the archive's headers over ranged GETs (``RangedObject``), never by
downloading the archive. Label files are downloaded into the work folder (``source-cache/``).

Every rule of a local scan holds: a key with a ``.`` or ``..`` segment, a leading ``/``, an empty segment, a
backslash or a control character is refused and counted under ``skipped`` as ``s3-unsafe-key`` with its
reason; hidden folders, system files and non-images are junk; a file outside a class folder or without a label
is quarantined. Nothing is written to the source bucket.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections import Counter
from collections.abc import Generator, Iterator
from dataclasses import asdict
from pathlib import Path, PurePath, PurePosixPath
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from imgest.core.errors import ConfigError
from imgest.core.settings import S3Settings
from imgest.sources.manifest import BATCH_ROWS, Candidate
from imgest.sources.s3objects import (
    ListedObject,
    RangedObject,
    client_for,
    getter_for,
    head,
    list_level,
    list_objects,
    settings_for,
    split_url,
)
from imgest.sources.s3source import SCHEME, s3_url
from imgest.sources.scanbase import CLS_LOC_SPLITS, LAYOUTS, SPLIT_NAMES, ScanReport, junk_kind
from imgest.sources.scanner import Scanner
from imgest.sources.tarsource import TRAIN_TAR, VAL_TAR, ImageNetTars, TarEntry, TarOfTars
from imgest.sources.tree import SAMPLE_LIMIT, Skips
from imgest.sources.valsolution import VAL_SOLUTION

log = logging.getLogger(__name__)

SOURCE_CACHE = "source-cache"  # label files of an S3 source, downloaded beside the manifest
UNSAFE_KEY = "s3-unsafe-key"
CLS_LOC_TREE = "ILSVRC/Data/CLS-LOC/"
INDEX_SUFFIX = ".index.parquet"  # a tar's member index, cached in SOURCE_CACHE
INDEX_FORMAT = 1
INDEX_SCHEMA = pa.schema(
    [
        ("wnid", pa.string()),
        ("rel_path", pa.string()),
        ("size", pa.int64()),
        ("mtime", pa.float64()),
        ("offset", pa.int64()),
    ]
)


def unsafe_key(rel: str) -> str | None:
    """Why the key REL (relative to the folder listed) cannot be taken as a path, or None when it can."""
    if rel.startswith("/"):
        return "absolute key (leading /)"
    if "\\" in rel:
        return "holds a backslash"
    if any(ord(c) < 32 or ord(c) == 127 for c in rel):
        return "holds a control character"
    parts = rel.split("/")
    if any(p in (".", "..") for p in parts):
        return "holds a . or .. segment (traversal)"
    if "" in parts:
        return "holds an empty segment (//)"
    return None


def _folder(prefix: str) -> str:
    """PREFIX as a folder prefix: '' or ending in exactly one '/'."""
    return prefix.rstrip("/") + "/" if prefix.strip("/") else ""


def _parent(key: str) -> str:
    """The folder prefix holding KEY ('' at the bucket's top)."""
    return _folder(key.rstrip("/").rpartition("/")[0])


class S3Scanner(Scanner):
    """A Scanner whose source is an S3 URL; streams candidates and fills ``report`` like a local scan."""

    def __init__(
        self,
        src: str,
        layout: str = "auto",
        dataset: str | None = None,
        flat_split: str = "train",
        settings: S3Settings | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        self.src = s3_url(src)
        self.bucket, key = split_url(self.src)
        self.settings = settings or settings_for(self.src)
        self.client = client_for(self.settings)
        self.getter = getter_for(self.settings)
        self.cache_dir = cache_dir or Path(tempfile.mkdtemp(prefix="imgest-s3-source-"))
        self._levels: dict[str, tuple[list[str], list[str]]] = {}
        self._object = bool(key) and not key.endswith("/") and head(self.client, self.bucket, key) is not None
        self.prefix = key if self._object else _folder(key)
        self.layout = self._detect() if layout == "auto" else layout
        if self.layout not in LAYOUTS:
            raise ConfigError(f"unknown layout {layout!r}; choose from auto, {', '.join(LAYOUTS)}")
        self.dataset = dataset or PurePosixPath(key.rstrip("/")).name.split(".")[0] or self.bucket
        self.flat_split = flat_split
        self.report = ScanReport(self.dataset, self.layout, self.src)
        self._tars: ImageNetTars | None = self._imagenet_tars() if self.layout == "tar" else None
        train = self._tars.train if self._tars else PurePosixPath(key)
        self._tar = self._archive(TarOfTars, train) if self._tars else TarOfTars(train, self.report.skipped)
        if self._tars and self._tars.val and flat_split == "val":
            raise ConfigError(
                f"split 'val' was asked for the train tar {self._tars.train.name}, but {self._tars.val} is scanned as "
                "split val: choose another --split or move the val tar"
            )
        self._base = self._data_base()
        self._root = f"{SCHEME}{self.bucket}/{self._base.rstrip('/')}".rstrip("/")  # type: ignore[assignment]
        self.report.classes = self._classes()
        self._label = {c.wnid: c.index for c in self.report.classes}

    # ---- listing ----------------------------------------------------------------------------------------
    def _level(self, prefix: str) -> tuple[list[str], list[str]]:
        """(folders, files) directly under PREFIX, hidden folders left out; listed once per scan."""
        if prefix not in self._levels:
            folders, files = list_level(self.client, self.bucket, prefix)
            self._levels[prefix] = ([f for f in folders if not f.startswith(".")], files)
        return self._levels[prefix]

    def _detect(self) -> str:
        if self._object:
            if self.prefix.endswith(".tar"):
                return "tar"
            raise ConfigError(f"{self.src} is an object but not a tar; point imgest at a prefix or an ImageNet tar")
        folders, files = self._level(self.prefix)
        if not folders and not files:
            raise ConfigError(f"{self.src} holds no objects: check the URL and the source connection (source_conn_id)")
        if "ILSVRC" in folders and self._level(self.prefix + CLS_LOC_TREE) != ([], []):
            return "cls-loc"
        if TRAIN_TAR in files and not any(name in folders for name in SPLIT_NAMES):
            return "tar"
        if VAL_SOLUTION in files:
            return "cls-loc"
        if any(name in folders for name in SPLIT_NAMES):
            return "imagefolder"
        return "flat"

    def _data_base(self) -> str:
        if self._tars is not None:
            return _parent(str(self._tars.train))
        if self.layout == "cls-loc" and self._level(self.prefix + CLS_LOC_TREE) != ([], []):
            return self.prefix + CLS_LOC_TREE
        return self.prefix

    def _imagenet_tars(self) -> ImageNetTars:
        if self._object:
            if PurePosixPath(self.prefix).name == VAL_TAR:
                raise ConfigError(
                    f"{self.src} is ImageNet's val tar: its labels are positions among the train classes, so give "
                    f"the prefix holding it with {TRAIN_TAR} and {VAL_SOLUTION} as the source"
                )
            train = self.prefix
        else:
            train = self.prefix + TRAIN_TAR
            if head(self.client, self.bucket, train) is None:
                raise ConfigError(f"{self.src} holds no {TRAIN_TAR}: the tar layout reads ImageNet's train tar")
        folder = _parent(train)
        val = folder + VAL_TAR
        has_val = val != train and head(self.client, self.bucket, val) is not None
        return ImageNetTars(
            PurePosixPath(train),  # type: ignore[arg-type]
            PurePosixPath(val) if has_val else None,  # type: ignore[arg-type]
            self._download(folder + VAL_SOLUTION),
        )

    def _download(self, key: str) -> Path | None:
        """The object KEY copied into the cache folder (label files only), or None when it does not exist."""
        found = head(self.client, self.bucket, key)
        if found is None:
            return None
        path = self.cache_dir / PurePosixPath(key).name
        path.parent.mkdir(parents=True, exist_ok=True)
        body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
        with open(path, "wb") as fh:
            for chunk in iter(lambda: body.read(1 << 20), b""):
                fh.write(chunk)
        return path

    # ---- layout specifics (the S3 side of Scanner's) -----------------------------------------------------
    def splits(self) -> list[str]:
        """The splits this scan reads, in order."""
        if self.layout == "cls-loc":
            return [s for s in CLS_LOC_SPLITS if s in self._level(self._base)[0]]
        if self.layout == "imagefolder":
            return [s for s in self._level(self._base)[0] if s in SPLIT_NAMES]
        if self._tars is not None and self._tars.val is not None:
            return [self.flat_split, "val"]
        return [self.flat_split]

    def _class_dirs(self, split: str) -> list[str]:
        if self.layout == "cls-loc":
            return self._level(self._base + "train/")[0] if split == "train" else []
        if self.layout == "imagefolder":
            return self._level(self._base + split + "/")[0]
        return self._level(self._base)[0]

    def _find(self, filename: str) -> Path | None:
        for folder in dict.fromkeys((self.prefix, self._base, _parent(self.prefix))):
            path = self._download(folder + filename)
            if path is not None:
                return path
        return None

    def _solution_hint(self, tars: ImageNetTars) -> str:
        return f"no {VAL_SOLUTION} beside {SCHEME}{self.bucket}/{tars.val}"

    def _archive(self, kind: type[Any], path: PurePath) -> IndexedArchive:
        """Archive PATH read by ranged GETs, its member index cached beside the manifest (keyed by ETag and size)."""
        key = str(path)
        found = head(self.client, self.bucket, key)
        if found is None:
            raise ConfigError(f"{SCHEME}{self.bucket}/{key} does not exist: check the source URL")
        size, etag = int(found["ContentLength"]), str(found.get("ETag", "")).strip('"')
        reader = kind(path, Skips(), junk_kind, opener=lambda: RangedObject(self.getter, self.bucket, key, size))
        return IndexedArchive(reader, self.cache_dir / (path.name + INDEX_SUFFIX), {"etag": etag, "size": size}, self)

    # ---- candidates -------------------------------------------------------------------------------------
    def _objects(self, under: str) -> Iterator[tuple[ListedObject, str, list[str]]]:
        """(object, key relative to the data root, path parts below UNDER) of every candidate under UNDER."""
        last_hidden = ""
        for obj in list_objects(self.client, self.bucket, under):
            if obj.key.endswith("/"):
                continue  # a folder marker, not a file
            inner = obj.key[len(under) :]
            problem = unsafe_key(inner)
            if problem:
                self.report.skipped.add(UNSAFE_KEY, repr(obj.key), problem)
                continue
            parts = inner.split("/")
            hidden = next((i for i, p in enumerate(parts[:-1]) if p.startswith(".")), None)
            if hidden is not None:
                folder = "/".join(parts[: hidden + 1])
                if folder != last_hidden:
                    self._junk("hidden-folder")
                    last_hidden = folder
                continue
            kind = junk_kind(parts[-1])
            if kind:
                self._junk(kind)
                continue
            yield obj, obj.key[len(self._base) :], parts

    def _folder_candidates(self) -> Iterator[Candidate]:
        splits = self.splits()
        labels: dict[str, str] = {}  # read first: a malformed label file fails before any image is listed
        if self.layout == "cls-loc" and "val" in splits:
            labels = self._val_labels(self._find(VAL_SOLUTION), f"no {VAL_SOLUTION}")
        for split in splits:
            under = self._base + split + "/" if self.layout in ("cls-loc", "imagefolder") else self._base
            if self.layout == "cls-loc" and split == "val":
                yield from self._s3_flat_val(under, labels)
                continue
            for obj, rel, parts in self._objects(under):
                if len(parts) < 2 or parts[0] not in self._label:
                    self._quarantine_no_label(split, rel, "file is not inside a class folder")
                    continue
                yield self._emit(split, rel, parts[0], obj.size, obj.mtime, etag=obj.etag)

    def _s3_flat_val(self, under: str, labels: dict[str, str]) -> Iterator[Candidate]:
        seen: set[str] = set()  # bounded by the val split (50,000 at ImageNet's count), as the labels are
        for obj, rel, _parts in self._objects(under):
            stem = PurePosixPath(rel).stem
            seen.add(stem)
            wnid = self._val_wnid(labels, rel, stem)
            if wnid is not None:
                yield self._emit("val", rel, wnid, obj.size, obj.mtime, etag=obj.etag)
        self._record_rows_without_file(labels, seen, f"{SCHEME}{self.bucket}/{under}")


class IndexedArchive:
    """An archive of an S3 source whose member index is built once, by streaming, and cached beside the manifest.

    The cache (``source-cache/<archive>.index.parquet``: one row per image member, and in its metadata the class
    names, the damage found and the skipped and junk members) is used while the object keeps its ETag and size,
    so a refresh of an unchanged 140 GB train tar costs one HEAD instead of reading it again. It is written only
    once the whole archive was read. Reports come out the same whether the index was built or loaded.
    """

    def __init__(self, reader: Any, cache: Path, stamp: dict[str, Any], scanner: Scanner) -> None:
        self._reader, self.path, self._cache, self._stamp = reader, reader.path, cache, stamp
        self._report = scanner.report
        self.broken: list[dict[str, Any]] = []
        self.truncated: list[tuple[str, str]] = []
        self._classes: list[str] | None = None
        self._hit = self._load()

    def _load(self) -> dict[str, Any] | None:
        try:
            meta = pq.read_metadata(self._cache).metadata or {}  # the file's key-value metadata (written last)
            doc = json.loads(meta[b"imgest_index"])
        except (OSError, KeyError, ValueError, pa.ArrowInvalid):
            return None
        if doc.get("stamp") != self._stamp or doc.get("format") != INDEX_FORMAT:
            return None
        log.info("member index of %s loaded from %s (ETag and size unchanged)", self.path, self._cache)
        return dict(doc)

    def class_names(self) -> list[str]:
        """Sorted class names of the train tar (from the cache when it is valid)."""
        if self._hit is not None:
            return list(self._hit["classes"])
        if self._classes is None:
            self._classes = self._reader.class_names()
        return list(self._classes)

    def entries(self) -> Iterator[TarEntry]:
        """Every readable image member in archive order; damage, skips and junk reach the scan report."""
        doc = self._hit if self._hit is not None else None
        if doc is None:
            doc = yield from self._build()
        else:
            for batch in pq.ParquetFile(self._cache).iter_batches(batch_size=BATCH_ROWS):
                for row in batch.to_pylist():
                    yield TarEntry(**row)
        self.broken = list(doc["broken"])
        self.truncated = [tuple(t) for t in doc["truncated"]]  # type: ignore[misc]
        for kind, count in doc["junk"].items():
            self._report.junk[kind] += count
        for kind, count in doc["skips"]["counts"].items():
            self._report.skipped.counts[kind] += count
            kept = self._report.skipped.samples.setdefault(kind, [])
            kept.extend(doc["skips"]["samples"].get(kind, [])[: max(0, SAMPLE_LIMIT - len(kept))])

    def _build(self) -> Generator[TarEntry, None, dict[str, Any]]:
        junk: Counter[str] = Counter()
        self._reader.on_junk = lambda kind: junk.update((kind,))
        classes = self.class_names() if isinstance(self._reader, TarOfTars) else []
        self._cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._cache.with_name(self._cache.name + ".partial")
        batch: list[TarEntry] = []
        with pq.ParquetWriter(tmp, INDEX_SCHEMA, compression="zstd") as writer:
            for entry in self._reader.entries():
                batch.append(entry)
                if len(batch) >= BATCH_ROWS:
                    writer.write_table(_index_table(batch))
                    batch = []
                yield entry
            writer.write_table(_index_table(batch))
            doc = {
                "format": INDEX_FORMAT,
                "stamp": self._stamp,
                "classes": classes,
                "broken": self._reader.broken,
                "truncated": self._reader.truncated,
                "junk": dict(junk),
                "skips": self._reader.skips.to_dict(),
            }
            # In the file's footer, written as the writer closes: the index is never read back whole (1.3 M rows
            # for ImageNet's train tar, 14 M for ImageNet-21k's).
            writer.add_key_value_metadata({"imgest_index": json.dumps(doc)})
        tmp.replace(self._cache)
        return doc


def _index_table(entries: list[TarEntry]) -> pa.Table:
    return pa.Table.from_pylist([asdict(e) for e in entries], schema=INDEX_SCHEMA)
