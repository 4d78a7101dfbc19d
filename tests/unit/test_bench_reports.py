"""What the benchmarks compute from their measurements (no timing is asserted): statistics, fits, comparisons,
targets, the machine line, and the datasets the pack sweep builds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imgest.bench import measure, pack, pack_data, transform
from imgest.bench.ingest_cassandra import _group
from imgest.bench.machine import machine_info
from imgest.core.report import describe_machine


def _run(wall: float, in_job: float | None = None, mb: float = 10.0, mb_in: float = 100.0) -> dict[str, float]:
    return {"wall_s": wall, "in_job_s": in_job or wall, "bytes": mb * 1e6, "bytes_in": mb_in * 1e6}


def test_fit_splits_fixed_from_per_image_cost() -> None:
    fixed, per_image = measure.fit_line([2000.0, 8000.0, 20000.0], [14.0, 20.0, 32.0])
    assert fixed == pytest.approx(12.0)
    assert per_image == pytest.approx(0.001)
    assert measure.fit_line([100.0], [5.0]) == (0.0, 0.05)


def test_rows_fits_comparisons_and_targets_follow_the_medians() -> None:
    measured = {
        1000: {
            "imgest Spark job": [_run(13.0, 2.0), _run(12.0, 1.8), _run(15.0, 2.2)],
            "webdataset ShardWriter, natural transform": [_run(4.0)] * 3,
            "LitData optimize, natural transform": [_run(8.0)] * 3,
            "webdataset ShardWriter, imgest transform": [_run(3.0)] * 3,
            "imgest unchanged, decode check": [_run(12.0, 1.0)] * 3,
        },
        3000: {
            "imgest Spark job": [_run(15.0, 4.0)] * 3,
            "webdataset ShardWriter, natural transform": [_run(10.0)] * 3,
            "LitData optimize, natural transform": [_run(9.0)] * 3,
            "webdataset ShardWriter, imgest transform": [_run(7.0)] * 3,
            "imgest unchanged, decode check": [_run(13.0, 0.5, mb_in=300.0)] * 3,
        },
    }
    rows, fits = pack.summarize(measured)
    first = next(r for r in rows if r["tool"] == "imgest Spark job" and r["images"] == 1000)
    assert first["wall_s"] == {"median": 13.0, "min": 12.0, "max": 15.0}
    assert first["in_job_s"]["median"] == 2.0
    assert first["rounds"] == 3
    spark_fit = next(f for f in fits if f["tool"] == "imgest Spark job")
    assert spark_fit == {"tool": "imgest Spark job", "fixed_s": 12.0, "per_image_ms": 1.0}
    unchanged = next(r for r in rows if r["tool"] == "imgest unchanged, decode check" and r["images"] == 3000)
    assert unchanged["mb_per_s_in_job"] == 600.0  # 300 MB of sources in 0.5 s
    comps = {(c["images"], c["peers_transform"]): c for c in pack.comparisons(rows)}
    assert comps[(1000, "natural")]["fastest_peer"] == "webdataset ShardWriter, natural transform"
    assert comps[(1000, "natural")]["imgest_vs_fastest_peer"] == 3.25
    assert comps[(3000, "natural")]["fastest_peer"] == "LitData optimize, natural transform"
    assert comps[(3000, "imgest")]["meets_target"] is None  # the packing systems alone: no target
    assert comps[(3000, "natural")]["meets_target"] is False  # 15 / 9 > 0.5


def test_pack_datasets_above_the_base_link_its_images_under_new_names(tmp_path: Path) -> None:
    base = tmp_path / "base"
    for i in range(3):
        (base / "train" / "n1").mkdir(parents=True, exist_ok=True)
        (base / "train" / "n1" / f"img{i}.JPEG").write_bytes(bytes([i]) * 10)
    pack_data.link_copies(base, tmp_path / "out", 7)
    made = sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*.JPEG"))
    assert len(made) == 7
    assert "train/n1/img0.JPEG" in made
    assert "train/n1/img0_r2.JPEG" in made
    assert "train/n1/img1_r2.JPEG" not in made
    assert (tmp_path / "out/train/n1/img2_r1.JPEG").stat().st_ino == (base / "train/n1/img2.JPEG").stat().st_ino


def test_cassandra_target_compares_writers_on_the_same_connection() -> None:
    rates = {"seed": [1000.0, 900.0, 1100.0], "seed_on_imgest_conn": [1500.0] * 3, "imgest": [2700.0, 2800.0, 2600.0]}
    group = _group("jpeg", 4000, 20.0, rates)
    assert group["speedup_same_connection"] == 1.8
    assert group["speedup_vs_seed_defaults"] == 2.7
    assert group["meets_target"] is False  # 1.8x < 2x on identical settings, whatever the seed's defaults give
    assert group["min_max_rows_per_s"]["seed"] == [900.0, 1100.0]


def test_machine_line_names_cores_versions_and_decoder() -> None:
    info = machine_info()
    line = describe_machine(info)
    assert f"{info['usable_cores']} cores" in line
    assert f"pillow {info['versions']['pillow']}" in line
    assert f"JPEG decoder {info['jpeg_decoder']}" in line
    json.dumps(info)  # goes into every report


def test_transform_report_has_rounds_min_max_and_quality(tmp_path: Path) -> None:
    report = transform.main(tmp_path / "t.json", tmp_path / "t.png", images=4, large_images=1, rounds=2, sources=[])
    assert json.loads((tmp_path / "t.json").read_text()) == report
    assert (tmp_path / "t.png").stat().st_size > 0
    for group in report["groups"]:
        assert group["speedup_min"] <= group["speedup"] <= group["speedup_max"]
        assert len(group["rounds_images_per_s"]["imgest"]) == 2
        assert group["psnr_imgest_db"] > 25
        assert group["psnr_baseline_db"] > 25
    assert report["machine"]["cpu_count"] >= 1


def test_targets_are_judged_at_the_largest_size_and_per_image() -> None:
    measured = {
        n: {
            "imgest Spark job": [_run(12.0 + n * 0.0014)],
            "webdataset ShardWriter, natural transform": [_run(5.0 + n * 0.003)],
            "imgest unchanged, decode check": [_run(12.0 + n * 0.001, 2.0 + n * 0.001, mb_in=n * 0.125)],
        }
        for n in (2000, 20000)
    }
    rows, fits = pack.summarize(measured)
    targets = pack.evaluate(rows, fits)
    natural = targets["imgest_vs_fastest_natural_peer"]
    assert natural["wall_ratio_at_largest"] == round(40.0 / 65.0, 2)
    assert natural["per_image_ratio"] == round(1.4 / 3.0, 2)
    assert (natural["met_at_largest"], natural["met_per_image"]) == (False, True)
    unchanged = targets["unchanged_decode_check_mb_per_s"]
    assert unchanged["in_job_at_largest"] == round(2500 / 22.0, 1)  # 2,500 MB in 22 s of job
    assert unchanged["per_image"] == 125.0  # 0.125 MB per image every 1 ms
    assert (unchanged["met_at_largest"], unchanged["met_per_image"]) == (False, True)


def test_writers_tree_links_each_image_under_its_copies_names(tmp_path: Path) -> None:
    from imgest.bench.plugin_writers import linked_copies, subset

    for cls, names in {"n1": ["a.JPEG", "b.JPEG"], "n2": ["c.JPEG"]}.items():
        (tmp_path / "src" / cls).mkdir(parents=True)
        for name in names:
            (tmp_path / "src" / cls / name).write_bytes(name.encode())
    out = linked_copies(tmp_path / "src", tmp_path / "x3", 3)
    made = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.JPEG"))
    assert made == [
        "train/n1/a.JPEG", "train/n1/a_r1.JPEG", "train/n1/a_r2.JPEG",
        "train/n1/b.JPEG", "train/n1/b_r1.JPEG", "train/n1/b_r2.JPEG",
        "train/n2/c.JPEG", "train/n2/c_r1.JPEG", "train/n2/c_r2.JPEG",
    ]  # fmt: skip
    assert (out / "train/n1/b_r2.JPEG").stat().st_ino == (tmp_path / "src/n1/b.JPEG").stat().st_ino
    assert linked_copies(tmp_path / "src", tmp_path / "x3", 3) == out  # made once
    eighth = subset(out, tmp_path / "x3-eighth", 8)
    assert sorted(p.name for p in eighth.rglob("*.JPEG")) == ["a.JPEG", "c.JPEG"]


def test_the_writers_rows_are_counted_after_the_cpu_window() -> None:
    """The bench's count of a writer's stored rows reads the node (a distinct-id scan); it runs once the writer's
    CPU window closed, so the node CPU per row is the writer's alone."""
    from imgest.bench.plugin_writers import with_cpu

    calls: list[str] = []

    def count() -> int:
        calls.append("count")
        return 500

    def wait() -> float:
        calls.append("settle")
        return 0.5

    out = with_cpu(lambda: calls.append("run") or {"writer": "w", "seconds": 1.0, "count": count}, None, wait)
    assert calls == ["run", "settle", "count"]
    assert out["rows"] == 500
    assert "count" not in out
    assert out["server_settle_s"] == 0.5
    assert out["server_cpu_ms_per_row"] == 0.0
