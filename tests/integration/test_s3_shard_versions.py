"""Versioned shard prefixes on the real S3 server (SeaweedFS): publishing writes only manifests outside v/<key>/,
the old version stays readable until the switch, the readers follow the entries, and gc pages through listings
and deletes in batches, keeping the live version and --keep before it."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from imgest.readback.check_s3 import s3_keys
from imgest.readback.datasets import shards_set
from imgest.readback.s3shards import S3ShardStream, S3StreamOptions
from imgest.services.s3 import S3Server
from imgest.sinks.shards.gc import collect
from imgest.sinks.shards.pack_publish import publish, samples_table
from imgest.sinks.shards.plan import ShardSpec, plan_shards
from imgest.sinks.shards.shard_table import shards_table
from imgest.sinks.shards.store import S3Store
from imgest.sinks.shards.store_names import manifest_objects
from imgest.sinks.shards.verify import verify_shards
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.scan import scan_to_dir
from imgest.transform.image import TransformSpec
from tests.shard_fixtures import pack_in_process

pytestmark = pytest.mark.services
PREFIX = "tests/shard-versions"
SHARDS = ShardSpec(max_count=6, seed=2)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("s3versions")
    write_sample(root / "src", SampleSpec("imagefolder", classes=3, per_class=6, val_per_class=2, seed=9))
    scan_to_dir(root / "src", root / "m")
    return root / "m"


@pytest.fixture
def store(s3_server: S3Server) -> Iterator[S3Store]:
    store = S3Store(s3_server.settings(), s3_server.bucket, PREFIX)
    _clear(s3_server)
    yield store
    _clear(s3_server)


def _listing(s3: S3Server) -> dict[str, str]:
    """Key (relative to PREFIX) -> ETag of every object under PREFIX, through every page."""
    pages = s3.settings().client().get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=PREFIX + "/")
    return {o["Key"][len(PREFIX) + 1 :]: o["ETag"] for page in pages for o in page.get("Contents", [])}


def _clear(s3: S3Server) -> None:
    client = s3.settings().client()
    keys = list(_listing(s3))
    for at in range(0, len(keys), 1000):
        batch = [{"Key": f"{PREFIX}/{k}"} for k in keys[at : at + 1000]]
        client.delete_objects(Bucket=s3.bucket, Delete={"Objects": batch, "Quiet": True})


def test_publish_writes_only_manifests_outside_the_version_prefix(
    manifest: Path, store: S3Store, s3_server: S3Server
) -> None:
    assert _listing(s3_server) == {}
    cfg_a, _, doc_a = pack_in_process(manifest, store, TransformSpec(quality=90), SHARDS)
    after_a = _listing(s3_server)
    assert {k for k in after_a if not k.startswith(f"v/{cfg_a.key}/")} == {
        "manifest.json",
        f"manifests/{cfg_a.key}.json",
    }
    assert manifest_objects(doc_a) <= set(after_a)

    cfg_b, records_b, doc_b = pack_in_process(manifest, store, TransformSpec(quality=60), SHARDS, publish_it=False)
    before_switch = _listing(s3_server)
    assert store.read_manifest() == doc_a  # the new version is written, the old one is still the live one
    assert verify_shards(store, workers=3).ok
    assert {k for k in before_switch if k not in after_a} == {
        k for k in before_switch if k.startswith(f"v/{cfg_b.key}/")
    }

    table = plan_shards(manifest / "manifest.parquet", SHARDS, cfg_b.spec)
    assert publish(store, doc_b, samples_table(table, []), shards_table(records_b))
    after_b = _listing(s3_server)
    changed = {k for k in after_b if before_switch.get(k) != after_b[k]}
    assert changed == {"manifest.json", f"manifests/{cfg_b.key}.json", doc_b["samples_table"], doc_b["shards_table"]}
    assert all(k in after_b for k in before_switch)  # nothing deleted, nothing copied

    rs = shards_set(store, split=None)
    assert sorted(rs.shards) == sorted(e["path"] for e in doc_b["shards"])
    stream = S3ShardStream(s3_server.settings(), s3_server.bucket, s3_keys(rs, PREFIX), S3StreamOptions(batch_size=5))
    ids = [key for _, _, keys, _ in stream.epoch_batches() for key in keys]
    assert sorted(ids) == sorted(rs.id_list())
    report = verify_shards(store, workers=4)
    assert report.ok
    assert report.hashed_bytes == doc_b["bytes"]


def test_gc_pages_through_listings_and_deletes_in_batches(manifest: Path, store: S3Store, s3_server: S3Server) -> None:
    keys = [pack_in_process(manifest, store, TransformSpec(quality=q), SHARDS)[0].key for q in (90, 75)]
    client = s3_server.settings().client()

    def put(name: str) -> Any:
        return client.put_object(Bucket=s3_server.bucket, Key=f"{PREFIX}/{name}", Body=b"junk")

    junk = [f"v/abandoned/part-{i:05d}" for i in range(1100)] + ["_staging/train-000000.tar"]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, junk))
    everything = _listing(s3_server)
    assert len(everything) > 1000  # the listing takes two pages

    dry = collect(store, keep=1, dry_run=True, min_age=0)
    assert dry.deleted == len(junk)
    assert dry.by_prefix == {"_staging": 1, "v/abandoned": 1100}
    assert _listing(s3_server) == everything
    assert collect(store, keep=1).deleted == 0  # default --min-age: the junk was written just now

    done = collect(store, keep=1, min_age=0)
    assert done.deleted == len(junk)  # 1,101 keys: two DeleteObjects requests
    left = _listing(s3_server)
    assert set(left) == set(everything) - set(junk)
    live = store.read_manifest()
    assert live is not None
    assert live["previous"] == keys[0]

    last = collect(store, keep=0, min_age=0)
    assert set(last.by_prefix) == {f"v/{keys[0]}", "manifests"}
    remaining = set(_listing(s3_server))
    assert not [k for k in remaining if k.startswith(f"v/{keys[0]}/")]
    assert manifest_objects(live) | {"manifest.json", f"manifests/{keys[1]}.json"} <= remaining
    assert verify_shards(store).ok
