"""The scale benchmark's dataset and arithmetic (no timing asserted): ImageNet's counts, fractions as hard links,
roles of processes, the fixed-cost fit and the ratios judged against the targets."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from imgest.bench import scale, scale_run
from imgest.sources.devdata.countscale import (
    CLS_LOC,
    CountScaleSpec,
    counts_of,
    fraction_counts,
    link_fraction,
    train_counts,
    val_classes,
    write_count_scale,
)

SMALL = CountScaleSpec(classes=6, train=70, val=12)


def test_imagenet_counts_have_imagenets_shape() -> None:
    counts = train_counts(CountScaleSpec())
    assert counts.sum() == 1_281_167
    assert counts.max() == 1300
    assert counts.min() >= 732
    assert (counts < 1300).sum() == 111
    assert np.bincount(val_classes(CountScaleSpec())).tolist() == [50] * 1000
    train, val = fraction_counts(CountScaleSpec(), 0.1)
    assert train.sum() == 128_150
    assert len(val) == 5_000


def test_generated_tree_is_cls_loc_with_distinct_images_and_labels(tmp_path: Path) -> None:
    root = write_count_scale(tmp_path / "full", SMALL, workers=1)
    train = sorted((root / CLS_LOC / "train").rglob("*.JPEG"))
    val = sorted((root / CLS_LOC / "val").glob("*.JPEG"))
    assert (len(train), len(val)) == (70, 12)
    assert len({p.read_bytes() for p in train + val}) == 82  # every image distinct
    with open(root / "LOC_val_solution.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted(r["ImageId"] + ".JPEG" for r in rows) == [p.name for p in val]
    assert counts_of(root) == {"train": 70, "val": 12}
    mtime = (root / "count-scale.json").stat().st_mtime_ns
    assert write_count_scale(root, SMALL) == root
    assert (root / "count-scale.json").stat().st_mtime_ns == mtime


def test_fraction_is_hard_linked_first_images_of_every_class(tmp_path: Path) -> None:
    full = write_count_scale(tmp_path / "full", SMALL, workers=1)
    part = link_fraction(full, tmp_path / "half", SMALL, 0.5)
    train = list((part / CLS_LOC / "train").rglob("*.JPEG"))
    assert len({p.parent.name for p in train}) == 6  # every class kept
    assert all(p.stat().st_nlink == 2 for p in train)  # the same bytes, not copies
    assert counts_of(part) == {"train": len(train), "val": 6}
    with open(part / "LOC_val_solution.csv") as fh:
        labelled = {r["ImageId"] + ".JPEG" for r in csv.DictReader(fh)}
    assert labelled == {p.name for p in (part / CLS_LOC / "val").glob("*.JPEG")}


def test_photo_spec_links_a_pool_of_imagenet_size_images(tmp_path: Path) -> None:
    spec = CountScaleSpec(classes=3, train=30, val=3, photo=4)
    root = write_count_scale(tmp_path / "bytes", spec, workers=1)
    images = list((root / CLS_LOC).rglob("*.JPEG"))
    assert len(images) == 33
    assert len({p.stat().st_ino for p in images}) <= 4
    from PIL import Image

    with Image.open(images[0]) as img:
        assert min(img.size) >= 300


def test_roles_follow_the_command_line() -> None:
    assert scale_run.role_of(["python", "-m", "imgest.bench.scale_step"], 7, 7) == "task"
    java = ["java", "-cp", "x", "org.apache.spark.deploy.SparkSubmit", "--master", "local[*]"]
    assert scale_run.role_of(java, 7, 8) == "spark_driver"
    assert scale_run.role_of(["/v/bin/python", "-m", "pyspark.daemon"], 7, 9) == "spark_worker"
    assert scale_run.role_of(["/v/bin/python", "-m", "imgest.spark.worker_daemon"], 7, 9) == "spark_worker"
    assert scale_run.role_of(["/v/bin/python", "/r/jobs/pack_shards.py", "--dest", "x"], 7, 9) == "driver_python"
    thin = ["/v/bin/python", "-m", "imgest.spark.thin_client", "/r/jobs/pack_shards.py", "--spark-remote", "sc://h:1"]
    assert scale_run.role_of(thin, 7, 9) == "driver_python"  # the Connect route's client
    assert scale_run.role_of(["java", "org.apache.cassandra.service.CassandraDaemon"], 7, 10) == "cassandra_server"
    assert scale_run.role_of(["bash"], 7, 11) is None


def _row(target: str, step: str, images: int, wall: float, task_mib: int, driver_mib: int = 0) -> dict:
    rss = {"task": task_mib << 20, "spark_driver": driver_mib << 20}
    return {"target": target, "step": step, "images": images, "wall_s": wall, "rss": rss, "rows_per_s": images / wall}


def test_summary_separates_fixed_cost_and_judges_ratios() -> None:
    rows = [
        _row("shards", "ingest_shards", 1_000, 12.0, 100, 500),
        _row("shards", "ingest_shards", 10_000, 21.0, 100, 520),
        _row("shards", "ingest_shards", 100_000, 111.0, 110, 560),
        _row("shards", "scan", 1_000, 1.0, 50),
        _row("shards", "scan", 10_000, 10.0, 200),
        _row("shards", "scan", 100_000, 200.0, 2000),
    ]
    summary = {s["step"]: s for s in scale.summarize(rows)}
    ingest = summary["ingest_shards"]
    assert ingest["fixed_s"] == pytest.approx(11.0, abs=0.1)
    assert ingest["per_image_ms"] == pytest.approx(1.0, rel=0.01)
    assert ingest["time_ratio"] == pytest.approx(111 / 21, rel=0.01)
    assert ingest["time_met"] is True
    assert ingest["peak_rss_role"] == "spark_driver"
    assert ingest["rss_met"] is True
    scan = summary["scan"]
    assert scan["time_ratio"] == 20.0
    assert scan["time_met"] is False
    assert scan["rss_ratio"] == 10.0
    assert scan["rss_met"] is False


def test_plot_is_written(tmp_path: Path) -> None:
    rows = [_row("cassandra", "scan", n, n / 1000, 60) for n in (1000, 10_000, 100_000)]
    scale.plot(tmp_path / "scale.png", scale.summarize(rows), "test")
    assert (tmp_path / "scale.png").stat().st_size > 10_000


def test_count21k_has_21k_classes_and_fractions_share_their_first_images(tmp_path: Path) -> None:
    import io
    import tarfile

    from imgest.sources.devdata import count21k

    full = count21k.class_counts(count21k.Count21kSpec())
    assert len(full) == 21_841
    assert full.sum() == 1_331_167
    assert full.min() >= 1
    assert 50 <= full.mean() <= 70
    assert full.max() > 5 * full.mean()

    spec = count21k.Count21kSpec(classes=12, images=90)
    small, whole = count21k.write_count21k(tmp_path, [0.25, 1.0], spec)
    stamp = whole.stat().st_mtime_ns
    assert count21k.write_count21k(tmp_path, [0.25, 1.0], spec) == [small, whole]  # cached: same spec, no rewrite
    assert count21k.write_count21k(tmp_path, [1.0], spec) == [whole]  # some of the fractions made: no rewrite
    assert whole.stat().st_mtime_ns == stamp
    half = count21k.write_count21k(tmp_path, [0.5], spec)[0]  # a new fraction: all made again, in one pass
    assert count21k.write_count21k(tmp_path, [0.25, 0.5, 1.0], spec) == [small, half, whole]
    assert half.stat().st_mtime_ns == count21k.write_count21k(tmp_path, [0.5], spec)[0].stat().st_mtime_ns

    def members(path: Path) -> dict[str, dict[str, bytes]]:
        out = {}
        with tarfile.open(path) as outer:
            for m in outer:
                data = outer.extractfile(m).read()  # type: ignore[union-attr]
                with tarfile.open(fileobj=io.BytesIO(data)) as inner:
                    out[m.name] = {i.name: inner.extractfile(i).read() for i in inner}  # type: ignore[union-attr]
        return out

    a, b = members(small), members(whole)
    wnids = list(b)
    assert len(wnids) == 12
    assert list(a) == wnids
    assert all(n.endswith(".tar") for n in wnids)
    counts = count21k.class_counts(spec)
    assert [len(b[w]) for w in wnids] == counts.tolist()
    assert [len(a[w]) for w in wnids] == count21k.fraction_counts(spec, 0.25).tolist()
    assert all(a[w][name] == b[w][name] for w in wnids for name in a[w])  # a fraction holds the first images
    assert len({data for w in wnids for data in b[w].values()}) == 90  # every image distinct
