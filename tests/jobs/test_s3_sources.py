"""Sources on S3 (the real SeaweedFS): every layout from a prefix, both ImageNet tars read by ranges (a corrupt
class tar, a truncated archive), hostile keys, and an ingest through the files job with the source only on S3.

The oracle is the local scan of the same bytes: an S3 scan must give the same manifest rows (ids, labels,
splits, keys, sizes, tar offsets) and the same report (junk, quarantine, skipped, broken containers), and every
candidate read from S3 must equal its local bytes. Nothing may be written to the source bucket.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from imgest.core.quarantine import BadImage, QuarantineLog, Reason
from imgest.core.settings import S3Settings
from imgest.services.s3 import S3Server
from imgest.services.spark_cluster import SparkCluster
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.manifest import Candidate, iter_manifest, manifest_metadata
from imgest.sources.read import read_candidate
from imgest.sources.s3objects import list_objects
from imgest.sources.s3scan import UNSAFE_KEY
from imgest.sources.s3source import register_source, source_env
from imgest.sources.scan import scan_to_dir
from imgest.transform.image import TransformSpec
from imgest.transform.pipeline import process_candidates
from tests.jobs.conftest import read_summary, run_job

pytestmark = [pytest.mark.services]

BUCKET = "imgest-src"  # the source bucket: apart from the destination's
TRAIN, VAL, CSV = "ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar", "LOC_val_solution.csv"
ROW_FIELDS = ("id", "split", "rel_path", "wnid", "label", "size", "container", "offset")


# The prefixes this process filled (upload): a module's teardown removes those only. Another xdist worker's
# tests fill prefixes of their own in the same bucket (tests/no-shared-disk/, tests/cluster-dag-source/) while
# this one runs; clearing all of tests/ emptied a prefix under another worker's running scan.
_FILLED: set[str] = set()


@pytest.fixture(scope="module")
def source(s3_server: S3Server) -> Iterator[S3Settings]:
    """The source bucket's connection; every prefix a test of this process filled is removed afterwards."""
    settings = S3Settings(**{**s3_server.settings().__dict__, "bucket": BUCKET})
    client = settings.client()
    if BUCKET not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket=BUCKET)
    yield settings
    while _FILLED:
        clear(settings, _FILLED.pop())


def clear(settings: S3Settings, prefix: str) -> None:
    client = settings.client()
    for obj in list_objects(client, BUCKET, prefix):
        client.delete_object(Bucket=BUCKET, Key=obj.key)


def upload(settings: S3Settings, root: Path, prefix: str) -> str:
    """Every file under ROOT put under PREFIX (cleared first); returns the source URL."""
    clear(settings, prefix)
    _FILLED.add(prefix)
    client = settings.client()
    for path in sorted(root.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), BUCKET, prefix + path.relative_to(root).as_posix())
    url = f"s3://{BUCKET}/{prefix}"
    register_source(url, settings)
    return url


def snapshot(settings: S3Settings, prefix: str) -> dict[str, tuple[int, str]]:
    return {o.key: (o.size, o.etag) for o in list_objects(settings.client(), BUCKET, prefix)}


def rows(manifest_dir: Path) -> dict[str, tuple[Any, ...]]:
    return {c.id: tuple(getattr(c, f) for f in ROW_FIELDS) for c in iter_manifest(manifest_dir / "manifest.parquet")}


def report(manifest_dir: Path) -> dict[str, Any]:
    """The scan report without what names the source (its root and the errors' wording)."""
    doc = json.loads((manifest_dir / "scan_report.json").read_text())
    broken = [(b["container"], b["members_read"]) for b in doc.pop("unreadable_containers")]
    for key in ("source", "summary", "warnings"):
        doc.pop(key)
    return {**doc, "unreadable_containers": broken}


def read_or_reason(root: Path, cand: Candidate) -> bytes | str:
    """CAND's bytes, or the quarantine reason reading them gave."""
    try:
        return read_candidate(root, cand)
    except BadImage as bad:
        return str(bad.reason)


def same_as_local(local: Path, url: str, tmp_path: Path, layout: str = "auto") -> tuple[Path, Path]:
    """Scan LOCAL and URL; assert the manifests, reports and bytes agree; returns both manifest folders."""
    lm, sm = tmp_path / "local", tmp_path / "s3"
    scan_to_dir(local, lm, layout, "ds")
    scan_to_dir(url, sm, layout, "ds")
    assert rows(sm) == rows(lm)
    assert report(sm) == report(lm)
    local_root, s3_root = (
        Path(manifest_metadata(lm / "manifest.parquet")["root"]),
        manifest_metadata(sm / "manifest.parquet")["root"],
    )
    assert s3_root.startswith(f"s3://{BUCKET}/")
    by_id = {c.id: c for c in iter_manifest(lm / "manifest.parquet")}
    for cand in iter_manifest(sm / "manifest.parquet"):
        data = read_or_reason(Path(s3_root), cand)  # executors get the root as a Path: s3:/bucket/...
        assert data == read_or_reason(local_root, by_id[cand.id])
        if isinstance(data, bytes) and not cand.container:
            assert cand.etag == hashlib.md5(data).hexdigest()  # single-part upload: the ETag is the MD5
    return lm, sm


@pytest.mark.parametrize("layout", ["cls-loc", "imagefolder", "flat"])
def test_each_folder_layout_from_a_prefix_scans_and_reads_like_the_local_tree(
    source: S3Settings, tmp_path: Path, layout: str
) -> None:
    made = "imagefolder" if layout == "flat" else layout
    write_sample(tmp_path / "tree", SampleSpec(made, classes=3, per_class=4, val_per_class=2, seed=3, defects=True))
    local = tmp_path / "tree" / "train" if layout == "flat" else tmp_path / "tree"
    train = next(p for p in (tmp_path / "tree").rglob("train") if p.is_dir())
    shutil.copyfile(next(train.glob("*/*_1.JPEG")), train / "stray.JPEG")  # outside a class folder: quarantined
    prefix = f"tests/layouts/{layout}/"
    url = upload(source, local, prefix)
    before = snapshot(source, prefix)
    _, sm = same_as_local(local, url, tmp_path)
    doc = json.loads((sm / "scan_report.json").read_text())
    assert doc["layout"] == layout
    assert doc["junk_skipped"] == {"hidden-folder": 1, "non-image-extension": 1, "system-file": 2}  # planted junk
    # the stray file, and in CLS-LOC also the val image its solution file does not list (planted)
    assert doc["quarantined"]["no-label"] == {"cls-loc": 2, "imagefolder": 1, "flat": 1}[layout]
    assert snapshot(source, prefix) == before  # nothing written to the source bucket


def _class_tars(train: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(train) as outer:
        return [(m.name, outer.extractfile(m).read()) for m in outer.getmembers() if m.isfile()]  # type: ignore[union-attr]


def _outer(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as out:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("s3-archives")
    write_sample(root, SampleSpec("tar", classes=4, per_class=3, val_per_class=2, seed=5, defects=True))
    return root


def test_both_tars_from_a_prefix_and_from_the_train_tar_url(source: S3Settings, archives: Path, tmp_path: Path) -> None:
    url = upload(source, archives, "tests/tars/full/")
    before = snapshot(source, "tests/tars/full/")
    _, sm = same_as_local(archives, url, tmp_path / "prefix")
    assert {c.container for c in iter_manifest(sm / "manifest.parquet")} == {TRAIN, VAL}
    assert json.loads((sm / "scan_report.json").read_text())["per_split"] == {"train": 12, "val": 8}
    _, by_url = same_as_local(archives / TRAIN, url + TRAIN, tmp_path / "object")
    assert rows(by_url) == rows(sm)  # the train tar's URL finds the val tar and its labels beside it
    assert (sm / "source-cache" / CSV).read_bytes() == (archives / CSV).read_bytes()
    assert snapshot(source, "tests/tars/full/") == before


def test_a_corrupt_class_tar_is_reported_and_the_others_are_kept(
    source: S3Settings, archives: Path, tmp_path: Path
) -> None:
    members = _class_tars(archives / TRAIN)
    members[1] = (members[1][0], b"this is not a tar archive" * 40)  # a damaged class tar
    members.append(("../evil.tar", members[0][1]))  # a hostile class tar name: refused, no class from it
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / TRAIN).write_bytes(_outer(members))
    url = upload(source, folder, "tests/tars/corrupt/")
    _, sm = same_as_local(folder, url, tmp_path)
    doc = json.loads((sm / "scan_report.json").read_text())
    assert [b["container"] for b in doc["unreadable_containers"]] == [members[1][0]]
    assert doc["skipped"]["counts"] == {"tar-unsafe-name": 1}
    kept = {c.wnid for c in iter_manifest(sm / "manifest.parquet")}
    assert kept == {n.removesuffix(".tar") for n, _ in members[:4]} - {members[1][0].removesuffix(".tar")}
    assert doc["per_split"] == {"train": 9}


def test_a_truncated_archive_read_by_ranges_quarantines_what_is_cut_and_loses_nothing(
    source: S3Settings, archives: Path, tmp_path: Path
) -> None:
    whole = (archives / TRAIN).read_bytes()
    with tarfile.open(archives / TRAIN) as outer:
        cut = outer.getmembers()[-1].offset_data + 2048 + 700  # inside the last class tar
    folder = tmp_path / "cut"
    folder.mkdir()
    (folder / TRAIN).write_bytes(whole[:cut])
    # At scan time: the index stops at the damage, the same way for the local file and the object.
    url = upload(source, folder, "tests/tars/cut/")
    _, sm = same_as_local(folder, url, tmp_path / "scan")
    doc = json.loads((sm / "scan_report.json").read_text())
    assert doc["unreadable_containers"]
    assert doc["kept"] < 12
    assert doc["kept"] + doc["quarantined"].get("corrupt", 0) >= 9  # read before the cut: kept or quarantined
    # After the scan: a whole archive indexed, then cut on S3; executors' ranged reads end early.
    full_url = upload(source, archives, "tests/tars/whole/")
    scan_to_dir(full_url, tmp_path / "whole", "auto", "ds")
    cut_url = upload(source, folder, "tests/tars/whole-cut/")
    train = [c for c in iter_manifest(tmp_path / "whole" / "manifest.parquet") if c.container == TRAIN]
    quarantine = QuarantineLog()
    spec = TransformSpec("unchanged", 256, 224, 90)
    stored = list(process_candidates(train, Path(cut_url), spec, quarantine))
    assert len(stored) + len(quarantine.entries) == len(train) == 12  # nothing lost
    assert stored
    assert quarantine.entries
    assert {e.reason for e in quarantine.entries} == {Reason.CORRUPT}
    assert all("ends" in e.detail and TRAIN in e.detail for e in quarantine.entries)
    assert all(p.candidate.offset + p.candidate.size <= cut for p in stored)
    late = next(c for c in train if c.offset + c.size > cut)
    with pytest.raises(BadImage, match=r"ends .* bytes early"):
        read_candidate(Path(cut_url), late)


def test_hostile_keys_are_refused_with_their_reason(source: S3Settings, tmp_path: Path) -> None:
    write_sample(tmp_path / "tree", SampleSpec("imagefolder", classes=2, per_class=2, val_per_class=1, seed=4))
    url = upload(source, tmp_path / "tree", "tests/hostile/")
    client = source.client()
    wnid = sorted(p.name for p in (tmp_path / "tree" / "train").iterdir())[0]
    body = next((tmp_path / "tree" / "train" / wnid).iterdir()).read_bytes()
    client.put_object(Bucket=BUCKET, Key=f"tests/hostile/train/{wnid}/ctl\x01name.JPEG", Body=body)
    client.put_object(Bucket=BUCKET, Key=f"tests/hostile/train/{wnid}/.../hidden.JPEG", Body=body)
    before = snapshot(source, "tests/hostile/")
    assert len(before) == 8, f"the server lists {sorted(before)} right after the upload"  # 6 images, 2 hostile
    scan_to_dir(url, tmp_path / "m", "auto", "ds")
    doc = json.loads((tmp_path / "m" / "scan_report.json").read_text())
    assert doc["skipped"]["counts"] == {UNSAFE_KEY: 1}
    assert "holds a control character" in doc["skipped"]["samples"][UNSAFE_KEY][0]
    assert doc["junk_skipped"] == {"hidden-folder": 1}
    listed = sorted(snapshot(source, "tests/hostile/"))
    assert doc["kept"] == 6, f"scan report {doc}; the server lists {listed}"  # what was missed, if ever
    assert all("\x01" not in c.rel_path for c in iter_manifest(tmp_path / "m" / "manifest.parquet"))
    assert snapshot(source, "tests/hostile/") == before


def test_refresh_compares_etag_and_size_not_the_upload_time(source: S3Settings, tmp_path: Path) -> None:
    from imgest.sources.diff import diff_manifest

    write_sample(tmp_path / "tree", SampleSpec("imagefolder", classes=2, per_class=3, val_per_class=1, seed=6))
    url = upload(source, tmp_path / "tree", "tests/refresh/")
    scan_to_dir(url, tmp_path / "a", "auto", "ds")
    root = Path(manifest_metadata(tmp_path / "a" / "manifest.parquet")["root"])
    changes = diff_manifest(tmp_path / "a" / "manifest.parquet", None, root, tmp_path / "baseline.parquet")
    assert len(changes.added) == 8
    client = source.client()
    keys = sorted(o.key for o in list_objects(client, BUCKET, "tests/refresh/train/"))
    client.put_object(Bucket=BUCKET, Key=keys[0], Body=client.get_object(Bucket=BUCKET, Key=keys[0])["Body"].read())
    other = (tmp_path / "tree" / keys[2].removeprefix("tests/refresh/")).read_bytes()
    client.put_object(Bucket=BUCKET, Key=keys[1], Body=other)  # new bytes (another image's)
    scan_to_dir(url, tmp_path / "b", "auto", "ds")
    changes = diff_manifest(
        tmp_path / "b" / "manifest.parquet", tmp_path / "baseline.parquet", root, tmp_path / "next.parquet"
    )
    assert changes.counts() == {"added": 0, "changed": 1, "removed": 0, "unchanged": 7}
    assert changes.touched_same_bytes == 0  # the re-upload kept its ETag: not even read


@pytest.mark.slow
def test_the_dags_scan_and_files_job_ingest_an_s3_source_like_the_same_local_tree(
    source: S3Settings, tmp_path: Path
) -> None:
    from imgest.flow.steps import scan_step
    from imgest.sinks.files.verify import verify_files

    spec = SampleSpec("imagefolder", classes=3, per_class=6, val_per_class=2, seed=8, defects=True)
    write_sample(tmp_path / "tree", spec)
    url = upload(source, tmp_path / "tree", "tests/job/")
    before = snapshot(source, "tests/job/")
    published = {}
    for name, src in (("local", str(tmp_path / "tree")), ("s3", url)):
        conf = {"source": src, "target": "files", "dataset": f"tests3src-{name}", "files_dest": str(tmp_path / name)}
        scanned = scan_step(conf, source if name == "s3" else None)  # what the DAG's scan task calls
        assert scanned["source_conn_id"] == ("aws_default" if name == "s3" else "")
        rc, out = run_job("write_files", scanned["files_args"], env=source_env(source) if name == "s3" else {})
        assert rc == 0, out[-3000:]
        doc = json.loads((tmp_path / name / "manifest.json").read_text())
        table = pq.read_table(tmp_path / name / doc["root"] / "samples.parquet")
        # the job's own count is that of the samples its version lists
        assert read_summary(Path(scanned["manifest_dir"]) / "ingest_files.json")["published"] == table.num_rows
        columns = (table.column(c).to_pylist() for c in ("split", "label", "wnid", "sha256"))
        published[name] = (sorted(zip(*columns, strict=True)), doc["quarantine"]["count"])
        assert verify_files(tmp_path / name, sample=0).ok  # every file there with its sha256
    assert published["s3"] == published["local"]  # the same images, labels and stored bytes; the same quarantine
    assert published["s3"][1] == 5  # the five planted undecodable files
    assert snapshot(source, "tests/job/") == before


@pytest.mark.slow
def test_cluster_packs_shards_from_an_s3_source_the_workers_reach_only_through_the_task(
    source: S3Settings, s3_server: S3Server, spark_cluster: SparkCluster, tmp_path: Path
) -> None:
    from imgest.cli import main
    from tests.cluster_watch import ClusterWatch, assert_clean

    """The shard pack on the cluster (the Cassandra ingest there is tests/dags/test_cluster_dag.py's), from a source
    with the planted defects: the quarantine runs on the executors."""
    spec = SampleSpec("cls-loc", classes=3, per_class=6, val_per_class=2, seed=31, defects=True)
    write_sample(tmp_path / "tree", spec)
    url = upload(source, tmp_path / "tree", "tests/cluster/")
    shutil.rmtree(tmp_path / "tree")  # no local copy anywhere: the source is the bucket
    dest, client = "s3://imgest/tests/cluster-s3-source", s3_server.settings().client()
    for obj in list_objects(client, "imgest", "tests/cluster-s3-source/"):
        client.delete_object(Bucket="imgest", Key=obj.key)
    work = tmp_path / "work"
    argv = ["ingest", "shards", url, "--work-dir", str(work), "--master", spark_cluster.master_url]
    with ClusterWatch(spark_cluster) as watch:
        assert main([*argv, "--dest", dest, "--max-count", "10"]) == 0
    doc = json.loads(client.get_object(Bucket="imgest", Key="tests/cluster-s3-source/manifest.json")["Body"].read())
    assert sum(doc["samples"].values()) == 18 + 6 + 8  # train + val + the eight awkward-but-valid planted images
    assert doc["quarantine"]["count"] == 5 + 1  # the five undecodable and the scan's no-label file
    assert all(s["samples"] <= 10 for s in doc["shards"])
    listed = {o.key for o in list_objects(client, "imgest", "tests/cluster-s3-source/")}
    assert all(f"tests/cluster-s3-source/{s['path']}" in listed for s in doc["shards"])
    assert main(["verify", "shards", dest]) == 0
    assert_clean(watch, spark_cluster, list(s3_server.credentials()), [work])


def test_a_shuffled_pack_from_an_archive_on_s3_reads_it_forward_and_writes_the_same_shards(
    source: S3Settings, s3_server: S3Server, tmp_path: Path
) -> None:
    """--read-order auto packs shards from a tar on S3 in the archive's order (one forward read, Spark moves each
    sample to its shard): the shards, their bytes and the quarantine (planted defects) are those of the plan's order."""
    write_sample(tmp_path / "src", SampleSpec("tar", classes=4, per_class=14, val_per_class=3, seed=8, defects=True))
    url = upload(source, tmp_path / "src", "tests/tars/order/")
    scan_to_dir(url, tmp_path / "m", "tar", "ds")
    client, key, secret = s3_server.settings().client(), *s3_server.credentials()
    env = {**source_env(source), "AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret}
    env["IMGEST_S3_ENDPOINT"] = s3_server.endpoint
    docs, summaries = {}, {}
    for order in ("plan", "auto"):
        prefix = f"tests/pack-order-{order}"
        for obj in list_objects(client, "imgest", prefix + "/"):
            client.delete_object(Bucket="imgest", Key=obj.key)
        out = tmp_path / f"{order}.json"
        args = ["--manifest-dir", str(tmp_path / "m"), "--dest", f"s3://imgest/{prefix}", "--max-count", "9"]
        rc, log = run_job("pack_shards", [*args, "--seed", "3", "--read-order", order, "--summary-json", str(out)], env)
        assert rc == 0, log[-3000:]
        summaries[order] = read_summary(out)
        docs[order] = json.loads(client.get_object(Bucket="imgest", Key=f"{prefix}/manifest.json")["Body"].read())
    assert summaries["plan"]["read_order"] == "plan"
    assert summaries["auto"]["read_order"] == "source"
    fields = ("name", "split", "samples", "bytes", "sha256", "digest", "path")
    plan, forward = ([{f: s[f] for f in fields} for s in docs[o]["shards"]] for o in ("plan", "auto"))
    assert forward == plan  # same shards, same tar bytes (sha256), same place
    assert len(plan) == 9  # this sample's train and val shards at 9 samples per shard
    assert docs["auto"]["quarantine"] == docs["plan"]["quarantine"]
    assert (
        docs["auto"]["quarantine"]["count"] == 2
    )  # the tar sample's planted defects, quarantined in the forward pass too
    assert docs["auto"]["samples"] == docs["plan"]["samples"]


class Requests(logging.Handler):
    """The GETs the source reader sends: the ObjectGetter's own DEBUG record of each request (key and range)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.gets: list[dict[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.startswith("GET "):
            bucket, key, ranged = record.args  # type: ignore[misc]
            self.gets.append({"Bucket": bucket, "Key": key, **({"Range": ranged} if ranged else {})})


@pytest.fixture
def seen() -> Iterator[Requests]:
    """The GETs sent while the test runs."""
    from imgest.sources import s3getter

    logger, requests = logging.getLogger(s3getter.__name__), Requests()
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(requests)
    yield requests
    logger.removeHandler(requests)
    logger.setLevel(level)


def test_members_share_coalesced_ranges_and_the_index_is_cached_beside_the_manifest(
    source: S3Settings, archives: Path, tmp_path: Path, seen: Requests
) -> None:
    url = upload(source, archives, "tests/tars/cache/")
    scan_to_dir(url, tmp_path / "m", "auto", "ds")
    first = [g for g in seen.gets if g["Key"].endswith(".tar")]
    assert first  # the index was built by streaming the archives over ranges
    assert all("Range" in g for g in first)  # never a whole-archive GET
    cached = {p.name for p in (tmp_path / "m" / "source-cache").iterdir()}
    assert cached == {CSV, "LOC_synset_mapping.txt", f"{TRAIN}.index.parquet", f"{VAL}.index.parquet"}
    before = (rows(tmp_path / "m"), report(tmp_path / "m"))
    seen.gets.clear()
    scan_to_dir(url, tmp_path / "m", "auto", "ds")  # a rescan (refresh) of unchanged archives
    assert [g for g in seen.gets if g["Key"].endswith(".tar")] == []  # the cached index: HEADs only
    assert (rows(tmp_path / "m"), report(tmp_path / "m")) == before
    # Executors: in archive order, every member of the (small) train tar comes from one coalesced range.
    train = [c for c in iter_manifest(tmp_path / "m" / "manifest.parquet") if c.container == TRAIN]
    seen.gets.clear()
    root = Path(url)
    by_ranges = [read_candidate(root, c) for c in train]
    assert len(seen.gets) == 1
    assert seen.gets[0]["Range"] == f"bytes=0-{(archives / TRAIN).stat().st_size - 1}"
    local = [read_candidate(archives, c) for c in train]
    assert by_ranges == local


def test_a_large_archive_is_read_in_8_mib_ranges_ahead_and_a_member_out_of_order_alone(
    source: S3Settings, tmp_path: Path, seen: Requests
) -> None:
    from imgest.sources import s3objects

    inner = [(f"n0{i}_{j}.JPEG", os.urandom(1_000_000 + j)) for i in range(3) for j in range(6)]
    classes = [(f"n0{i}.tar", _outer(inner[6 * i : 6 * i + 6])) for i in range(3)]
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / TRAIN).write_bytes(_outer(classes))
    url = upload(source, tmp_path / "src", "tests/tars/large/")
    scan_to_dir(url, tmp_path / "m", "tar", "ds")
    seen.gets.clear()
    train = list(iter_manifest(tmp_path / "m" / "manifest.parquet"))
    assert [read_candidate(Path(url), c) for c in train] == [data for _, data in inner]
    size = (tmp_path / "src" / TRAIN).stat().st_size
    block = s3objects.COALESCE_BYTES
    assert sorted(g["Range"] for g in seen.gets) == sorted(
        f"bytes={start}-{min(size, start + block) - 1}" for start in range(0, size, block)
    )  # one request per 8 MiB, each fetched once, none past the end
    seen.gets.clear()
    assert read_candidate(Path(url), train[0]) == inner[0][1]  # back to the start: its own exact range
    assert [g["Range"] for g in seen.gets] == [f"bytes={train[0].offset}-{train[0].offset + train[0].size - 1}"]
    # A partition that starts mid-archive (another process: no reader yet): its first member alone, then the
    # rest forward from blocks.
    s3objects._archives.clear()
    seen.gets.clear()
    assert [read_candidate(Path(url), c) for c in train[9:]] == [data for _, data in inner[9:]]
    mid = train[9].offset // block
    assert sorted(g["Range"] for g in seen.gets) == sorted(
        [
            f"bytes={train[9].offset}-{train[9].offset + train[9].size - 1}",
            *(f"bytes={b * block}-{min(size, (b + 1) * block) - 1}" for b in range(mid, -(-size // block))),
        ]
    )


def test_shuffled_archive_members_are_read_ahead_by_their_own_ranges(
    source: S3Settings, tmp_path: Path, seen: Requests
) -> None:
    """A shard's members (a seeded shuffle of the archive): each by one exact ranged GET, DEPTH in flight, no 8 MiB
    block fetched for a member that does not follow the last; in archive order the blocks serve them as before."""
    import random

    from imgest.sources import s3objects
    from imgest.sources.read import read_ahead

    inner = [(f"n0{i}_{j}.JPEG", os.urandom(300_000 + j)) for i in range(4) for j in range(10)]
    classes = [(f"n0{i}.tar", _outer(inner[10 * i : 10 * i + 10])) for i in range(4)]
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / TRAIN).write_bytes(_outer(classes))
    url = upload(source, tmp_path / "src", "tests/tars/shuffled/")
    scan_to_dir(url, tmp_path / "m", "tar", "ds")
    train = list(iter_manifest(tmp_path / "m" / "manifest.parquet"))
    expected = {c.id: data for c, (_, data) in zip(train, inner, strict=True)}
    shuffled = random.Random(7).sample(train, len(train))
    s3objects._archives.clear()
    seen.gets.clear()
    got = list(read_ahead(Path(url), shuffled, depth=8))
    assert [c.id for c, _ in got] == [c.id for c in shuffled]
    assert all(data == expected[c.id] for c, data in got)
    exact = sorted(f"bytes={c.offset}-{c.offset + c.size - 1}" for c in shuffled)
    assert sorted(g["Range"] for g in seen.gets) == exact  # each member once, by its own bytes; no block
    seen.gets.clear()
    in_order = list(read_ahead(Path(url), train, depth=8))
    assert all(data == expected[c.id] for c, data in in_order)
    assert len(seen.gets) < len(train) // 2  # the manifest's order: served from coalesced blocks


def test_read_ahead_keeps_order_and_reasons_with_gets_in_flight(source: S3Settings, tmp_path: Path) -> None:
    from imgest.sources.read import read_ahead

    write_sample(tmp_path / "tree", SampleSpec("imagefolder", classes=2, per_class=10, val_per_class=2, seed=9))
    url = upload(source, tmp_path / "tree", "tests/ahead/")
    scan_to_dir(url, tmp_path / "m", "auto", "ds")
    cands = list(iter_manifest(tmp_path / "m" / "manifest.parquet"))
    source.client().delete_object(Bucket=BUCKET, Key=f"tests/ahead/{cands[3].rel_path}")  # vanished after the scan
    got = list(read_ahead(Path(url), cands, depth=4))
    assert [c.id for c, _ in got] == [c.id for c in cands]
    assert isinstance(got[3][1], BadImage)
    assert got[3][1].reason == Reason.MISSING
    for cand, data in got[:3] + got[4:]:
        assert data == (tmp_path / "tree" / cand.rel_path).read_bytes()


def test_an_object_changed_since_the_scan_or_a_refused_connection_is_named(source: S3Settings, tmp_path: Path) -> None:
    from dataclasses import replace

    from imgest.sources.s3objects import S3SourceError

    write_sample(tmp_path / "tree", SampleSpec("imagefolder", classes=2, per_class=3, val_per_class=1, seed=12))
    url = upload(source, tmp_path / "tree", "tests/changed/")
    scan_to_dir(url, tmp_path / "m", "auto", "ds")
    cands = list(iter_manifest(tmp_path / "m" / "manifest.parquet"))
    client = source.client()
    client.put_object(Bucket=BUCKET, Key=f"tests/changed/{cands[0].rel_path}", Body=b"other bytes, same key")
    with pytest.raises(BadImage, match=r"tests/changed/.* changed since the scan \(ETag differs\)") as bad:
        read_candidate(Path(url), cands[0])  # never read with the scanned label: If-Match on the scanned ETag
    assert bad.value.reason == Reason.MISSING
    assert read_candidate(Path(url), cands[1]) == (tmp_path / "tree" / cands[1].rel_path).read_bytes()
    register_source(url, replace(source, secret_key="not-the-secret"))
    try:
        with pytest.raises(S3SourceError, match=r"cannot read s3://imgest-src/tests/changed/.*HTTP 403 .*connection"):
            read_candidate(Path(url), cands[1])
    finally:
        register_source(url, source)


@pytest.mark.slow
def test_the_cli_reads_an_s3_source_with_the_connection_named_by_source_conn_id(
    source: S3Settings, tmp_path: Path
) -> None:
    import subprocess
    import sys

    write_sample(tmp_path / "tree", SampleSpec("imagefolder", classes=2, per_class=4, val_per_class=1, seed=13))
    url = upload(source, tmp_path / "tree", "tests/cli-conn/")
    conn = {
        "conn_type": "aws",
        "login": source.access_key,
        "password": source.secret_key,
        "extra": {"endpoint_url": source.endpoint_url, "region_name": source.region},
    }
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW_CONN_TEST_SOURCE": json.dumps(conn),
        "IMGEST_SOURCE_AWS_ACCESS_KEY_ID": "nobody",  # the variables name keys the store refuses
        "IMGEST_SOURCE_AWS_SECRET_ACCESS_KEY": "not-the-secret",
    }
    imgest = str(Path(sys.executable).parent / "imgest")
    argv = [imgest, "ingest", "files", url, "--dest", str(tmp_path / "files"), "--work-dir", str(tmp_path / "work")]
    refused = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert refused.returncode != 0
    assert "s3://imgest-src/tests/cli-conn" in refused.stderr
    assert "403" in refused.stderr
    assert "check the source connection" in refused.stderr
    done = subprocess.run(
        [*argv, "--source-conn-id", "test_source"], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    doc = json.loads((tmp_path / "files" / "manifest.json").read_text())
    assert sum(doc["samples"].values()) == 2 * 4 + 2 * 1
    assert source.secret_key not in done.stdout + done.stderr  # the keys travel in the environment only
    missing = subprocess.run(
        [*argv, "--source-conn-id", "no_such_conn"], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert missing.returncode != 0
    assert "no Airflow connection 'no_such_conn'" in missing.stderr
