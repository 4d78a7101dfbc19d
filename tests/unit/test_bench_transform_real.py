"""`imgest bench transform --source DIR`: every file judged, the distribution per group, the quarantine check."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from imgest.bench import transform, transform_real
from imgest.sources.devdata.images import photo_like
from imgest.transform import fastjpeg


def _save(path: Path, width: int, height: int, seed: int, **options: object) -> bytes:
    img = photo_like(np.random.default_rng(seed), width, height, np.array([0.3, 0.4, 0.3]))
    out = io.BytesIO()
    img.convert(str(options.pop("mode", "RGB"))).save(out, "JPEG", quality=90, **options)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(out.getvalue())
    return out.getvalue()


@pytest.mark.skipif(not fastjpeg.available(), reason=f"region decoder not built: {fastjpeg.BUILD_HINT}")
def test_a_folder_is_judged_image_by_image_with_the_refused_files_accounted_for(tmp_path: Path) -> None:
    src = tmp_path / "set"
    _save(src / "a.jpg", 500, 375, 1)
    _save(src / "sub" / "grey.jpg", 375, 500, 2, mode="L")
    _save(src / "cmyk.jpg", 500, 333, 3, mode="CMYK")
    _save(src / "big.jpg", 2048, 1536, 4)
    whole = _save(src / "cut.jpg", 500, 375, 5)
    (src / "cut.jpg").write_bytes(whole[: len(whole) // 2])  # truncated: Pillow refuses it, imgest quarantines it
    (src / "notes.txt").write_text("not an image, not part of the set")
    (src / "origins.tsv").write_text("file\tpackage\n")

    report = transform.main(tmp_path / "r.json", tmp_path / "r.png", 0, 0, rounds=1, sources=[src], generated=False)

    assert json.loads((tmp_path / "r.json").read_text()) == report
    with Image.open(tmp_path / "r.png") as png:
        assert (png.format, png.size) == ("PNG", (1320, 528))  # 12 x 4.8 inches at 110 dpi
    real = report["real"]
    assert {row[0] for row in real["per_image"]} == {"set/a.jpg", "set/sub/grey.jpg", "set/cmyk.jpg", "set/big.jpg"}
    groups = {g["group"]: g for g in real["groups"]}
    assert groups["real: imagenet-size"]["images"] == 3
    assert groups["real: >= 2 MP"]["images"] == 1
    for group in groups.values():
        assert group["delta_p5_db"] > -0.5  # the region decoder is as good as Pillow on these
        assert group["worst_files"][0][0].startswith("set/")
        rounds = group["rounds_images_per_s"]  # one round: the speed-up is that round's ratio
        assert group["speedup"] == pytest.approx(rounds["imgest"][0] / rounds["baseline"][0], rel=0.02)
    quarantine = real["quarantine"]
    assert (quarantine["files"], quarantine["pillow_decodes"], quarantine["imgest_transformed"]) == (5, 4, 4)
    assert quarantine["decodable_but_quarantined"] == []
    assert [r["file"] for r in quarantine["pillow_refuses"]] == ["set/cut.jpg"]
    assert quarantine["pillow_refuses"][0]["imgest"].startswith("corrupt")
    assert quarantine["meets_target"] is True


def test_quality_summary_names_the_worst_files() -> None:
    judged = [
        transform_real.Judged(f"f{i}", b"", 200_000, None, None, 30.0, 30.0 + d)
        for i, d in enumerate([0.1, -0.2, 0.0, -1.0, 0.05] * 4)
    ]
    summary = transform_real.quality(judged)
    assert summary["images_scored"] == 20
    assert summary["delta_worst_db"] == -1.0
    assert summary["delta_p5_db"] == -1.0  # 1 of 20 is the 5th percentile
    assert summary["below_minus_0_5_db"] == 4
    assert [name for name, _ in summary["worst_files"][:4]] == ["f3", "f8", "f13", "f18"]
    assert summary["meets_quality_target"] is False


def test_an_image_that_pillow_decodes_but_imgest_quarantines_fails_the_check() -> None:
    ok = transform_real.Judged("good.jpg", b"", 1, None, None, 30.0, 30.0)
    lost = transform_real.Judged("lost.jpg", b"", 1, None, "corrupt: something")
    check = transform_real.quarantine_check([ok, lost])
    assert check["decodable_but_quarantined"] == [["lost.jpg", "corrupt: something"]]
    assert check["meets_target"] is False


@pytest.mark.skipif(not fastjpeg.available(), reason=f"region decoder not built: {fastjpeg.BUILD_HINT}")
def test_the_imagenet_size_group_is_split_into_baseline_and_progressive_files(tmp_path: Path) -> None:
    src = tmp_path / "set"
    _save(src / "a.jpg", 500, 375, 1)
    _save(src / "b.jpg", 375, 500, 2)
    _save(src / "p.jpg", 500, 375, 3, progressive=True)

    real = transform_real.run_sources([src], transform_real.TransformSpec(), 1)

    groups = {g["group"]: g["images"] for g in real["groups"]}
    assert groups == {
        "real: imagenet-size": 3,
        "real: imagenet-size, baseline": 2,
        "real: imagenet-size, progressive": 1,
    }
    assert real["per_image_columns"][-1] == "coding"
    assert {row[0]: row[-1] for row in real["per_image"]}["set/p.jpg"] == "progressive"
    transform_real.distribution_plot(tmp_path / "r.png", real)  # the split groups are plotted too
