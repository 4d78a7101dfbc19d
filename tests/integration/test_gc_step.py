"""The DAGs' gc step on the real S3 server (SeaweedFS): two published shard versions, keep_versions 1 keeps both,
0 deletes the older one's objects and never what the live manifest names; a run whose version is no longer the
live one removes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from imgest.core import workdir
from imgest.flow.steps import collect_garbage
from imgest.services.s3 import S3Server
from imgest.sinks.shards.plan import ShardSpec
from imgest.sinks.shards.store import S3Store
from imgest.sinks.shards.store_names import manifest_objects
from imgest.sinks.shards.verify import verify_shards
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.scan import scan_to_dir
from imgest.transform.image import TransformSpec
from tests.shard_fixtures import pack_in_process

pytestmark = pytest.mark.services
PREFIX = "tests/gc-step"
SHARDS = ShardSpec(max_count=6, seed=3)


def _listing(s3: S3Server) -> set[str]:
    pages = s3.settings().client().get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=PREFIX + "/")
    return {o["Key"][len(PREFIX) + 1 :] for page in pages for o in page.get("Contents", [])}


def _clear(s3: S3Server) -> None:
    client = s3.settings().client()
    keys = sorted(_listing(s3))
    for at in range(0, len(keys), 1000):
        batch = [{"Key": f"{PREFIX}/{k}"} for k in keys[at : at + 1000]]
        client.delete_objects(Bucket=s3.bucket, Delete={"Objects": batch, "Quiet": True})


@pytest.fixture
def store(s3_server: S3Server) -> Iterator[S3Store]:
    _clear(s3_server)
    yield S3Store(s3_server.settings(), s3_server.bucket, PREFIX)
    _clear(s3_server)


def test_gc_step_keeps_the_published_version_and_keep_versions_before_it(
    store: S3Store, s3_server: S3Server, tmp_path: Path
) -> None:
    write_sample(tmp_path / "src", SampleSpec("imagefolder", classes=3, per_class=6, val_per_class=2, seed=8))
    work = tmp_path / "work"
    scan_to_dir(tmp_path / "src", work)
    first = pack_in_process(work, store, TransformSpec(quality=90), SHARDS)[0].key
    second, _, live = pack_in_process(work, store, TransformSpec(quality=70), SHARDS)
    (work / workdir.SHARDS_SUMMARY).write_text(json.dumps({"key": second.key}))  # what the run's pack job wrote
    before = _listing(s3_server)
    assert any(k.startswith(f"v/{first}/") for k in before)
    conf = {"source": str(tmp_path / "src"), "dataset": "gc-step", "target": "shards"}
    conf["s3_dest"] = f"s3://{s3_server.bucket}/{PREFIX}"

    kept = collect_garbage({**conf, "keep_versions": 1}, s3_server.settings(), work)
    assert (kept["current"], kept["kept"], kept["deleted"]) == (second.key, [second.key, first], 0)
    assert _listing(s3_server) == before

    done = collect_garbage({**conf, "keep_versions": 0}, s3_server.settings(), work)
    assert done["kept"] == [second.key]
    assert done["deleted"] > 0
    assert set(done["by_prefix"]) == {f"v/{first}", "manifests"}  # the old version and its manifest copy
    after = _listing(s3_server)
    assert before - after == {k for k in before if k.startswith(f"v/{first}/")} | {f"manifests/{first}.json"}
    assert done["deleted"] == len(before - after)
    assert manifest_objects(live) | {"manifest.json"} <= after  # nothing the live manifest names
    assert verify_shards(store).ok

    (work / workdir.SHARDS_SUMMARY).write_text(json.dumps({"key": first}))  # a run whose version was replaced
    declined = collect_garbage({**conf, "keep_versions": 0}, s3_server.settings(), work)
    assert declined["current"] == second.key
    assert "no longer names" in declined["skipped"]
    assert _listing(s3_server) == after


def test_gc_step_has_nothing_to_do_for_cassandra() -> None:
    conf = {"sample": True, "target": "cassandra", "keep_versions": 0}
    assert collect_garbage(conf, None)["skipped"].startswith("the cassandra target")
