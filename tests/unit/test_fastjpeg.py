"""The JPEG region decoder: same picture as the Pillow path, same quarantine, recorded in the transform."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from imgest.bench.transform import psnr, reference_pixels
from imgest.core.errors import ConfigError
from imgest.core.quarantine import BadImage
from imgest.sources.devdata.defects import broken_images
from imgest.sources.devdata.images import jpeg_bytes, photo_like
from imgest.transform import fastjpeg
from imgest.transform.image import TransformSpec, transform_image

pytestmark = pytest.mark.skipif(not fastjpeg.available(), reason=f"region decoder not built: {fastjpeg.BUILD_HINT}")

REGION = TransformSpec(jpeg_decoder="region")
PILLOW = TransformSpec(jpeg_decoder="pillow")


def _jpeg(width: int, height: int, seed: int = 3, mode: str = "RGB", **save: object) -> bytes:
    img = photo_like(np.random.default_rng(seed), width, height, np.array([0.5, 0.3, 0.2])).convert(mode)
    out = io.BytesIO()
    img.save(out, "JPEG", quality=92, **save)
    return out.getvalue()


def _pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float64)


@pytest.mark.parametrize(
    ("size", "mode", "save"),
    [
        ((500, 375), "RGB", {}),  # ImageNet-size landscape: 8/8 scale
        ((333, 500), "RGB", {}),  # portrait, odd width
        ((2592, 1944), "RGB", {}),  # 2/8 scale
        ((3264, 2448), "RGB", {}),  # 1/8 scale
        ((240, 230), "RGB", {}),  # barely larger than the crop
        ((120, 90), "RGB", {}),  # smaller than the output: upsampled
        ((640, 480), "L", {}),  # grayscale JPEG
        ((640, 480), "RGB", {"progressive": True}),
        ((641, 479), "RGB", {"subsampling": 0}),  # 4:4:4
    ],
)
def test_region_decoder_draws_the_same_crop_as_pillow(size: tuple[int, int], mode: str, save: dict) -> None:
    data = _jpeg(*size, mode=mode, **save)
    ours, theirs = transform_image(data, REGION), transform_image(data, PILLOW)
    assert (ours.width, ours.height, ours.src_width, ours.src_height) == (224, 224, *size)
    assert ours.data != theirs.data  # really the other code path
    ref = reference_pixels(data, REGION)
    # Same crop, same place: the two outputs agree closely, and ours is no further from the reference.
    agreement = psnr(ours.data, _pixels(theirs.data))
    assert agreement > 34, agreement
    assert psnr(ours.data, ref) > psnr(theirs.data, ref) - 0.5


def test_region_decoder_is_deterministic() -> None:
    data = _jpeg(500, 375, seed=9)
    assert transform_image(data, REGION).data == transform_image(data, REGION).data


@pytest.mark.parametrize("name", sorted(broken_images()))
def test_broken_files_get_the_same_reason_from_both_decoders(name: str) -> None:
    data, reason = broken_images()[name]
    for spec in (REGION, PILLOW, replace(REGION, mode="unchanged"), replace(PILLOW, mode="unchanged")):
        with pytest.raises(BadImage) as err:
            transform_image(data, spec)
        assert err.value.reason == reason, spec


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9, 0.97, 0.995])
def test_a_truncated_jpeg_is_refused_wherever_it_is_cut(keep: float) -> None:
    """Cut above, inside and below the crop region: the rows below it are never decoded, and still a file that
    ends early is refused, with the Pillow path's wording."""
    data = _jpeg(500, 375, seed=5)
    cut = data[: int(len(data) * keep)]
    refusals = [_refusal(cut, spec) for spec in (REGION, PILLOW, replace(REGION, mode="unchanged"))]
    assert {r.reason for r in refusals} == {"corrupt"}
    assert refusals[0].detail == refusals[1].detail


def _refusal(data: bytes, spec: TransformSpec) -> BadImage:
    try:
        transform_image(data, spec)
    except BadImage as bad:
        return bad
    raise AssertionError(f"accepted with {spec}")


def test_the_check_reads_every_entropy_coded_byte() -> None:
    data = _jpeg(500, 375, seed=6)
    assert fastjpeg.check(data) == (500, 375)
    assert fastjpeg.check(data[: len(data) - 300]) is None  # libjpeg runs out of data: Pillow decides
    assert fastjpeg.check(data, max_pixels=500 * 375 - 1) is None  # over the limit: nothing decoded


def test_unchanged_decode_check_keeps_the_bytes_and_refuses_what_pillow_refuses() -> None:
    data = _jpeg(640, 480, seed=7)
    ours, theirs = (
        transform_image(data, replace(REGION, mode="unchanged")),
        transform_image(data, replace(PILLOW, mode="unchanged")),
    )
    assert ours == theirs
    assert ours.data is data
    small = replace(REGION, mode="unchanged", max_pixels=640 * 480 - 1)
    assert _refusal(data, small).reason == _refusal(data, replace(small, jpeg_decoder="pillow")).reason == "too-large"


def test_scale_is_a_power_of_two_that_never_upsamples() -> None:
    assert fastjpeg.scale_eighths(328.0, 224, True) == 8  # 6/8 would fit, but has no SIMD inverse DCT
    assert fastjpeg.scale_eighths(1344.0, 224, True) == 2
    assert fastjpeg.scale_eighths(1792.0, 224, True) == 1
    assert fastjpeg.scale_eighths(1701.0, 224, True) == 2  # 1/8 would give 212 < 224
    assert fastjpeg.scale_eighths(1792.0, 224, False) == 8


def test_the_decoder_is_part_of_the_recorded_transform() -> None:
    assert TransformSpec().jpeg_decoder == "region"
    assert TransformSpec().as_dict()["jpeg_decoder"] == "region"
    old = {k: v for k, v in REGION.as_dict().items() if k != "jpeg_decoder"}  # a record from before the field
    assert TransformSpec.from_record(old).jpeg_decoder == "pillow"
    assert TransformSpec.from_record(REGION.as_dict()) == REGION
    with pytest.raises(ConfigError, match="JPEG decoder"):
        TransformSpec(jpeg_decoder="turbo")  # type: ignore[arg-type]


def test_a_spec_naming_an_unbuilt_decoder_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastjpeg, "_module", None)  # an installation without the compiled module
    assert TransformSpec().jpeg_decoder == "pillow"
    with pytest.raises(ConfigError, match="libjpeg-dev"):
        TransformSpec(jpeg_decoder="region")


def test_the_compiled_module_loads_when_the_package_runs_from_a_py_files_zip(tmp_path: Path) -> None:
    """Spark executors of a non-local master import imgest from the --py-files zip, from which no extension
    module can load: the installed one is found instead."""
    from imgest.spark.submit import package_zip

    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import imgest; from imgest.transform import fastjpeg\n"
        "print(imgest.__file__); print(fastjpeg.available())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(package_zip())], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0].startswith(str(package_zip()))
    assert out[1] == "True"


@pytest.mark.parametrize(
    ("large", "digest"),
    [
        (False, "77098e401859393e732a2f5cd1112658cdbee2405474cbad08e9ebf17df6cf5a"),
        (True, "4930946ca2015fb641c7534778b542ead98949f31d141f2793aa97cb48ff0916"),
    ],
)
def test_the_pillow_decoder_writes_what_versions_before_the_field_wrote(large: bool, digest: str) -> None:
    """Records without jpeg_decoder read as 'pillow': its output must stay byte for byte what the transform wrote
    before the region decoder existed (these digests came from that release, with the pinned Pillow)."""
    data = jpeg_bytes(np.random.default_rng([7, int(large)]), np.array([0.2, 0.5, 0.3]), large)
    assert hashlib.sha256(transform_image(data, PILLOW).data).hexdigest() == digest
