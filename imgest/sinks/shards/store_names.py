"""Where a shards destination keeps what: the versioned prefixes ``v/<key>/``, the manifests' history, the
staging area of the older layout, and the objects a manifest names."""

from __future__ import annotations

from typing import Any

from imgest.core import workdir
from imgest.sinks.shards.shard_table import TABLE_KEY

STAGING = "_staging"  # the staging area of the layout before versioned prefixes (collected by gc)


VERSIONS = "v"  # <dest>/v/<key>/: the immutable objects of one plan


HISTORY = "manifests"  # <dest>/manifests/<key>.json: every manifest published, for gc's --keep


def version_prefix(key: str) -> str:
    """The folder, relative to the destination, of the objects of plan KEY: ``v/<key>``."""
    return f"{VERSIONS}/{key}"


def history_name(key: str) -> str:
    """Where the manifest published for plan KEY is kept: ``manifests/<key>.json``."""
    return f"{HISTORY}/{key}.json"


def shard_object(entry: dict[str, Any]) -> str:
    """The tar of manifest ENTRY, relative to the destination (``path``; old manifests: its ``name``)."""
    return str(entry.get("path") or entry["name"])


def shard_objects(entry: dict[str, Any]) -> list[str]:
    """Every object of manifest ENTRY relative to the destination: tar, .idx and .info.json (when listed)."""
    tar = shard_object(entry)
    return [
        tar,
        str(entry.get("index") or workdir.shard_index(tar)),
        *([str(entry["info"])] if "info" in entry else []),
    ]


def samples_object(manifest: dict[str, Any]) -> str:
    """The samples.parquet that MANIFEST describes, relative to the destination."""
    return str(manifest.get("samples_table") or workdir.PUBLISHED_SAMPLES)


def tables_objects(manifest: dict[str, Any]) -> list[str]:
    """The tables MANIFEST names beside its shards: samples.parquet, and shards.parquet when it has one."""
    return [samples_object(manifest), *([str(manifest[TABLE_KEY])] if manifest.get(TABLE_KEY) else [])]


def manifest_objects(manifest: dict[str, Any]) -> set[str]:
    """Every object MANIFEST refers to (shards, indexes, sidecars, samples and shards tables), relative to the
    destination."""
    names = {name for entry in manifest.get("shards", []) for name in shard_objects(entry)}
    return names | set(tables_objects(manifest))
