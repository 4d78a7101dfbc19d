"""The JPEG region decoder: same picture as the Pillow path, same quarantine, recorded in the transform."""

from __future__ import annotations

import hashlib
import importlib
import io
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from functools import cache, partial
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from PIL import Image, ImageDraw

from imgest.bench.transform_speed import baseline_transform, psnr, reference_pixels
from imgest.core.errors import ConfigError
from imgest.core.quarantine import BadImage
from imgest.sinks.cassandra.ingest import transform_key
from imgest.sources.devdata.defects import broken_images
from imgest.sources.devdata.images import jpeg_bytes, photo_like
from imgest.transform import fastjpeg
from imgest.transform.image import (
    REGION_SETTINGS,
    Transformed,
    TransformSpec,
    _transform_opened,
    open_checked,
    transform_image,
)

pytestmark = pytest.mark.skipif(not fastjpeg.available(), reason=f"region decoder not built: {fastjpeg.BUILD_HINT}")

REGION = TransformSpec(jpeg_decoder="region")
REGION2 = TransformSpec(jpeg_decoder="region2")
REGION3 = TransformSpec(jpeg_decoder="region3")
REGION4 = TransformSpec(jpeg_decoder="region4")
PILLOW = TransformSpec(jpeg_decoder="pillow")


@cache
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
@pytest.mark.parametrize("decoder", ["region", "region2", "region4"])
def test_region_decoder_draws_the_same_crop_as_pillow(
    size: tuple[int, int], mode: str, save: dict, decoder: str
) -> None:
    data = _jpeg(*size, mode=mode, **save)
    ours, theirs = transform_image(data, replace(REGION, jpeg_decoder=decoder)), transform_image(data, PILLOW)
    assert (ours.width, ours.height, ours.src_width, ours.src_height) == (224, 224, *size)
    assert ours.data != theirs.data  # really the other code path
    ref = reference_pixels(data, REGION)
    # Same crop, same place: the two outputs agree closely, and ours is no further from the reference.
    agreement = psnr(ours.data, _pixels(theirs.data))
    assert agreement > (30 if decoder == "region4" else 34), agreement  # region4: bicubic, Pillow's path bilinear
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


HEADER_CHECK = TransformSpec(mode="unchanged", unchanged_check="header")


def test_the_header_check_reads_the_header_with_libjpeg(monkeypatch: pytest.MonkeyPatch) -> None:
    """--unchanged-check header reads a JPEG's header with libjpeg, not Pillow, and records what Pillow reads."""
    data = _jpeg(500, 375, seed=6)
    assert fastjpeg.header(data) == (500, 375)
    assert fastjpeg.header(data[:300]) is None  # the header itself cut short: Pillow decides and words it

    def no_pillow(*args: object) -> None:
        raise AssertionError("Pillow opened a JPEG the compiled header read accepts")

    monkeypatch.setattr("imgest.transform.image.open_checked", no_pillow)
    for w, h in ((500, 375), (641, 479), (17, 2000)):
        jpeg = _jpeg(w, h, seed=w)
        out = transform_image(jpeg, HEADER_CHECK)
        assert out.data is jpeg
        assert (out.width, out.height, out.src_width, out.src_height, out.src_format) == (w, h, w, h, "JPEG")
        assert (out.width, out.height) == Image.open(io.BytesIO(jpeg)).size


def test_the_header_check_leaves_every_doubt_to_pillow() -> None:
    """Truncated, over the pixel limit, or a header libjpeg refuses: the Pillow path decides, with its reasons."""
    data = _jpeg(500, 375, seed=7)
    assert _refusal(data[:-2], HEADER_CHECK).reason == "corrupt"  # no end marker
    assert _refusal(data, replace(HEADER_CHECK, max_pixels=500 * 375 - 1)).reason == "too-large"
    sof = data.index(b"\xff\xc0")
    no_components = data[: sof + 9] + b"\x00" + data[sof + 10 :]  # a frame of zero components: libjpeg refuses it
    assert fastjpeg.header(no_components) is None
    assert _refusal(no_components, HEADER_CHECK).reason == "corrupt"
    cut_header = data[:200] + b"\xff\xd9"  # the end marker right after a header cut short
    assert fastjpeg.header(cut_header) is None
    assert _refusal(cut_header, HEADER_CHECK).reason == "corrupt"
    for name, (bad, reason) in broken_images().items():
        assert _refusal(bad, HEADER_CHECK).reason == reason, name


def _with_segment(jpeg: bytes, marker: bytes, payload: bytes) -> bytes:
    """JPEG with an APPn segment MARKER (2 bytes) of PAYLOAD right after its SOI."""
    return jpeg[:2] + marker + (len(payload) + 2).to_bytes(2, "big") + payload + jpeg[2:]


def test_headers_libjpeg_reads_but_pillow_may_not_go_to_pillow() -> None:
    """libjpeg accepts more than Pillow opens: a 2-component frame, a JFIF APP0 or Adobe APP14 too short for the
    fields Pillow reads; and Pillow opens a file with MPF in an APP2 as MPO. The compiled header read leaves all
    of them (and any APP2: ICC profiles) to the Pillow path, so what is stored or refused is what Pillow decides."""
    data = _jpeg(64, 48, seed=8)
    sof = data.index(b"\xff\xc0")
    length = int.from_bytes(data[sof + 2 : sof + 4], "big")
    frame = bytearray(data[sof + 4 : sof + 2 + length])
    frame[5] = 2  # two components, the third one's spec dropped
    two = data[: sof + 2] + (12 + 2).to_bytes(2, "big") + bytes(frame[:12]) + data[sof + 2 + length :]
    jfif = data.index(b"\xff\xe0")
    short_jfif = (
        data[:jfif] + b"\xff\xe0\x00\x07JFIF\x00" + data[jfif + 2 + int.from_bytes(data[jfif + 2 : jfif + 4], "big") :]
    )
    short_adobe = _with_segment(data, b"\xff\xee", b"Adobe")
    for name, doubtful in (("2 components", two), ("short JFIF", short_jfif), ("short Adobe", short_adobe)):
        assert fastjpeg.header(doubtful) is None, name
        assert (
            _refusal(doubtful, HEADER_CHECK).reason
            == _refusal(doubtful, replace(HEADER_CHECK, jpeg_decoder="pillow")).reason
            == "corrupt"
        ), name
    icc = _with_segment(data, b"\xff\xe2", b"ICC_PROFILE\x00\x01\x01" + b"\x00" * 128)
    assert fastjpeg.header(icc) is None
    out = io.BytesIO()
    Image.open(io.BytesIO(data)).save(out, "MPO", save_all=True, append_images=[Image.new("RGB", (64, 48))])
    mpo = out.getvalue()
    assert fastjpeg.header(mpo) is None
    assert transform_image(mpo, HEADER_CHECK).src_format == "MPO"  # as Pillow opens it, not "JPEG"


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
    # region2 keeps the decoded crop at least 2x the output: 3088x2056's 1799-pixel crop decodes at 2/8, not 1/8
    assert fastjpeg.scale_eighths(1799.0, 224, True, 2.0) == 2
    assert fastjpeg.scale_eighths(1400.0, 224, True, 2.0) == 4  # 2560x1600: 2/8 would be 1.56x
    assert fastjpeg.scale_eighths(3584.0, 224, True, 2.0) == 1
    assert fastjpeg.scale_eighths(800.0, 224, True, 2.0) == 8


def test_the_decoder_is_part_of_the_recorded_transform() -> None:
    assert TransformSpec().jpeg_decoder == "region4"
    assert TransformSpec().as_dict()["jpeg_decoder"] == "region4"
    old = {k: v for k, v in REGION.as_dict().items() if k != "jpeg_decoder"}  # a record from before the field
    assert TransformSpec.from_record(old).jpeg_decoder == "pillow"
    assert TransformSpec.from_record(REGION.as_dict()) == REGION  # versions the first revision wrote
    assert TransformSpec.from_record(REGION2.as_dict()) == REGION2
    assert TransformSpec.from_record(REGION3.as_dict()) == REGION3
    # The revisions write different bytes, so they are different transforms (version names, shard keys).
    assert len({transform_key(REGION), transform_key(REGION2), transform_key(REGION3)}) == 3
    assert transform_key(PILLOW) == PILLOW_KEY  # the Pillow path's key is what it was before region2
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


PILLOW_KEY = "b55970af4f2c"  # transform_key(PILLOW) before region2 existed: its versions keep their names


@pytest.mark.parametrize(
    ("large", "digest"),
    [
        (False, "bba9f097af453a6e03eb39292eca369c8cbb2e49c407b01b85ed78902ad59892"),
        (True, "40a312729be5227593f57cbfb975a2dfaf07d0495207be09049daf15ba9cf0db"),
    ],
)
def test_the_first_region_decoder_writes_what_it_wrote_before_region2(large: bool, digest: str) -> None:
    """Versions recorded with jpeg_decoder="region" verify by re-transforming: its bytes must not move (these
    digests came from the release before region2, and matched on all 294 files of the real-photo set too)."""
    data = jpeg_bytes(np.random.default_rng([7, int(large)]), np.array([0.2, 0.5, 0.3]), large)
    assert hashlib.sha256(transform_image(data, REGION).data).hexdigest() == digest


def _detailed(width: int, height: int, mode: str = "RGB", seed: int = 1) -> bytes:
    """Sharp-edged detail at every scale (thousands of small rectangles): what aliases when decoding at 1/8."""
    rng = np.random.default_rng(seed)
    img = Image.new("RGB", (width, height), (128, 128, 128))
    draw = ImageDraw.Draw(img)
    for _ in range(4000):
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        corner = (x + int(rng.integers(8, 60)), y + int(rng.integers(8, 60)))
        draw.rectangle([(x, y), corner], fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    out = io.BytesIO()
    img.convert(mode).save(out, "JPEG", quality=92)
    return out.getvalue()


def _delta(data: bytes, spec: TransformSpec) -> float:
    """PSNR(transform) - PSNR(plain Pillow pipeline), both against the full-precision reference."""
    ref = reference_pixels(data, spec)
    return float(psnr(transform_image(data, spec).data, ref) - psnr(baseline_transform(data, spec), ref))


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_a_photo_reduced_8x_is_as_good_as_pillow_since_region2(mode: str) -> None:
    """3088x2056 to 256: the first revision decoded at 1/8 (a 257-pixel crop for 224: aliased, 0.3 dB below
    Pillow in colour, 3.3 dB in grey); region2 keeps the decoded crop >= 2x the output (2/8 here)."""
    data = _detailed(3088, 2056, mode)
    assert _delta(data, REGION2) > -0.15
    assert _delta(data, REGION) < _delta(data, REGION2) - 0.2


def _cmyk_jpeg(rgb: Image.Image) -> bytes:
    out = io.BytesIO()
    rgb.convert("CMYK").save(out, "JPEG", quality=95)  # Pillow writes Adobe's inverted CMYK, as Photoshop does
    return out.getvalue()


def test_cmyk_decodes_to_the_colour_it_was_made_from_on_both_paths() -> None:
    """Adobe CMYK (inverted samples, APP14 marker): a known colour comes back, from the region decoder and from
    the Pillow path alike; a photo agrees with the reference within 0.5 dB."""
    colour = (200, 40, 90)
    data = _cmyk_jpeg(Image.new("RGB", (640, 480), colour))
    assert Image.open(io.BytesIO(data)).mode == "CMYK"
    for spec in (REGION2, PILLOW):
        mean = _pixels(transform_image(data, spec).data).reshape(-1, 3).mean(axis=0)
        assert np.abs(mean - colour).max() < 3, (spec.jpeg_decoder, mean)
    photo = _cmyk_jpeg(photo_like(np.random.default_rng(4), 900, 600, np.array([0.6, 0.2, 0.3])))
    ours, theirs = transform_image(photo, REGION2), transform_image(photo, PILLOW)
    assert ours.data != theirs.data  # really the region decoder
    assert psnr(ours.data, _pixels(theirs.data)) > 34
    assert _delta(photo, REGION2) > -0.5


@pytest.mark.parametrize("orientation", [2, 3, 4, 5, 6, 7, 8])
def test_exif_orientation_is_decoded_by_region2_as_the_upright_picture(orientation: int) -> None:
    """A camera stores the pixels sideways and says so in EXIF: region2 maps the crop box into the stored pixels
    and turns its 224x224 output; the picture is the upright one's, as good as Pillow's full pipeline."""
    upright = photo_like(np.random.default_rng(8), 800, 533, np.array([0.3, 0.5, 0.2]))
    stored = upright.transpose(STORE[orientation])
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    stored.save(out, "JPEG", quality=95, exif=exif.tobytes())
    data = out.getvalue()
    ours = transform_image(data, REGION2)
    assert (ours.src_width, ours.src_height) == (800, 533)
    assert ours.data != transform_image(data, PILLOW).data
    plain = io.BytesIO()
    upright.save(plain, "JPEG", quality=95)
    assert psnr(ours.data, _pixels(transform_image(plain.getvalue(), REGION2).data)) > 36
    assert _delta(data, REGION2) > -0.1


# EXIF orientation -> how the upright picture is stored under it (the inverse of image.ORIENTATION_FIX).
STORE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


def test_mpo_first_frame_goes_through_region2() -> None:
    """An MPO (two JPEG frames, as stereo cameras write) is its first frame, like Pillow's."""
    frames = [photo_like(np.random.default_rng(s), 640, 480, np.array([0.4, 0.4, 0.2])) for s in (1, 2)]
    out = io.BytesIO()
    frames[0].save(out, "MPO", save_all=True, append_images=frames[1:], quality=92)
    data = out.getvalue()
    assert Image.open(io.BytesIO(data)).format == "MPO"
    ours = transform_image(data, REGION2)
    assert ours.data != transform_image(data, PILLOW).data
    assert _delta(data, REGION2) > -0.1


def _through_pillow(data: bytes, spec: TransformSpec = REGION2) -> Transformed:
    """A region revision as region2 ran before the one-call path: Pillow reads the header and EXIF, crop_resize
    decodes, Pillow's encoder writes the JPEG."""
    return _transform_opened(data, open_checked(data, spec.max_pixels), spec, one_call=False)


def _oriented(orientation: int, mode: str = "RGB", **save: object) -> bytes:
    upright = photo_like(np.random.default_rng(11), 900, 600, np.array([0.3, 0.5, 0.2])).convert(mode)
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    upright.transpose(STORE[orientation]).save(out, "JPEG", quality=93, exif=exif.tobytes(), **save)
    return out.getvalue()


def _cmyk_photo() -> bytes:
    return _cmyk_jpeg(photo_like(np.random.default_rng(4), 900, 600, np.array([0.6, 0.2, 0.3])))


XMP_6 = b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:Description tiff:Orientation="6"/></x:xmpmeta>'


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(partial(_jpeg, 500, 375), id="imagenet-size"),
        pytest.param(partial(_jpeg, 333, 500), id="portrait"),
        pytest.param(partial(_jpeg, 2592, 1944), id="2/8 scale"),
        pytest.param(partial(_jpeg, 4000, 3000), id="1/8 scale"),
        pytest.param(partial(_jpeg, 120, 90), id="upsampled"),
        pytest.param(partial(_jpeg, 640, 480, mode="L"), id="grey"),
        pytest.param(partial(_jpeg, 640, 480, progressive=True), id="progressive"),
        pytest.param(partial(_jpeg, 2592, 1944, progressive=True), id="progressive 2/8"),
        pytest.param(partial(_jpeg, 641, 479, subsampling=0), id="4:4:4"),
        pytest.param(partial(_jpeg, 640, 480, restart_marker_blocks=4), id="restart markers"),
        pytest.param(partial(_cmyk_photo), id="cmyk"),
        *(pytest.param(partial(_oriented, o), id=f"orientation {o}") for o in range(2, 9)),
        pytest.param(partial(_oriented, 6, "L"), id="grey orientation 6"),
        pytest.param(partial(_jpeg, 900, 600, xmp=XMP_6), id="xmp orientation"),
    ],
)
@pytest.mark.parametrize("spec", [REGION2, REGION3, REGION4], ids=["region2", "region3", "region4"])
def test_the_one_call_path_writes_the_revisions_bytes_exactly(make: Callable[[], bytes], spec: TransformSpec) -> None:
    """transform_image runs header, EXIF / XMP orientation, region decode, turn and JPEG encoding in one compiled
    call: byte for byte what the Pillow-header path with Pillow's encoder writes (region2 ran that way, so the
    versions it wrote still verify). Inputs are made when the test runs (cached), not at collection."""
    data = make()
    assert fastjpeg.transform(data, 256, 224, 90, 10**8, True, REGION_SETTINGS[spec.jpeg_decoder]) is not None
    assert transform_image(data, spec) == _through_pillow(data, spec)


def test_the_one_call_path_leaves_to_pillow_what_pillow_must_judge() -> None:
    """MPO (Pillow names the format), two EXIF blocks (Pillow joins them), a truncated file, one over the pixel
    limit and a PNG get None from the compiled call, then the Pillow path decides as before."""
    settings = REGION_SETTINGS["region2"]
    frames = [photo_like(np.random.default_rng(s), 640, 480, np.array([0.4, 0.4, 0.2])) for s in (1, 2)]
    mpo = io.BytesIO()
    frames[0].save(mpo, "MPO", save_all=True, append_images=frames[1:], quality=92)
    plain = _jpeg(500, 375)
    exif = b"\xff\xe1\x00\x16Exif\x00\x00II*\x00\x08\x00\x00\x00" + bytes(6)  # an EXIF block, empty IFD0
    two_exif = plain[:2] + exif + exif + plain[2:]
    png = io.BytesIO()
    frames[0].save(png, "PNG")
    for data in (mpo.getvalue(), two_exif, plain[:-400], png.getvalue()):
        assert fastjpeg.transform(data, 256, 224, 90, 10**8, True, settings) is None
    assert fastjpeg.transform(plain, 256, 224, 90, 500 * 375 - 1, True, settings) is None
    assert fastjpeg.transform(plain, 256, 224, 90, 500 * 375, True, settings) is not None
    assert transform_image(mpo.getvalue(), REGION2).src_format == "MPO"
    assert transform_image(two_exif, REGION2) == _through_pillow(two_exif)
    assert _refusal(plain[:-400], REGION2).reason == "corrupt"
    assert _refusal(plain, replace(REGION2, max_pixels=500 * 375 - 1)).reason == "too-large"


def test_a_batch_in_one_call_equals_the_calls_one_by_one() -> None:
    settings = REGION_SETTINGS["region2"]
    batch = [_jpeg(500, 375, seed=s) for s in range(3)] + [b"not a jpeg", _jpeg(2592, 1944), _oriented(8)]
    one_by_one = [fastjpeg.transform(d, 256, 224, 90, 10**8, True, settings) for d in batch]
    assert fastjpeg.transform_many(batch, 256, 224, 90, 10**8, True, settings) == one_by_one
    assert one_by_one[3] is None
    assert all(r is not None for i, r in enumerate(one_by_one) if i != 3)


def test_region3_leaves_the_last_ac_bits_of_large_progressive_files_unread() -> None:
    """region3 = region2, except that a progressive file decoded at a reduced DCT scale stops before the scans that
    refine the AC coefficients' last bit: other bytes, as good against the reference. Sequential files, and
    progressive ones decoded at full scale (ImageNet size), are region2's bytes."""
    large = _detailed(2592, 1944)
    progressive = io.BytesIO()
    Image.open(io.BytesIO(large)).save(progressive, "JPEG", quality=92, progressive=True)
    data = progressive.getvalue()
    assert transform_image(data, REGION3).data != transform_image(data, REGION2).data
    assert _delta(data, REGION3) > _delta(data, REGION2) - 0.1
    assert _delta(data, REGION3) > -0.1
    for same in (large, _jpeg(500, 375, progressive=True)):
        assert transform_image(same, REGION3) == transform_image(same, REGION2)


def _compiled() -> ModuleType:
    """The compiled module itself, for what fastjpeg does not wrap: crop_resize's flag 8."""
    assert fastjpeg._module is not None
    return fastjpeg._module


TESTING_MODULE = "imgest.transform._fastjpeg_testing"
TEST_HOOKS = ("arithmetic", "refine_counts")


def _testing() -> ModuleType:
    """The compiled module with its test-only entry points (arithmetic(), refine_counts()): the same sources built with
    FASTJPEG_TEST_HOOKS, which setup.py adds where IMGEST_BUILD_TEST_HOOKS=1 (make install-dev). Without it the test
    skips, saying so; under CI that skip fails (tests/conftest.py)."""
    try:
        return importlib.import_module(TESTING_MODULE)
    except ImportError as exc:
        pytest.skip(
            f"{TESTING_MODULE} is not built ({exc}): rebuild with IMGEST_BUILD_TEST_HOOKS=1 "
            "(make install-dev, or IMGEST_BUILD_TEST_HOOKS=1 .venv/bin/python setup.py build_ext --inplace)"
        )


def test_the_production_module_has_no_test_hooks() -> None:
    assert [name for name in TEST_HOOKS if hasattr(_compiled(), name)] == []
    assert _compiled().__name__ == "imgest.transform._fastjpeg"


def test_the_testing_module_has_the_hooks_and_writes_the_production_modules_bytes() -> None:
    """_fastjpeg_testing is _fastjpeg plus the hooks: the same transform, byte for byte, on every kind of file."""
    production, testing = _compiled(), _testing()
    assert all(callable(getattr(testing, name)) for name in TEST_HOOKS)
    batch = [
        _jpeg(500, 375),
        _jpeg(2592, 1944),
        _jpeg(640, 480, progressive=True),
        _jpeg(640, 480, mode="L"),
        _oriented(6),
        _cmyk_photo(),
        testing.arithmetic(_jpeg(500, 375), 7),
        b"not a jpeg",
    ]
    for settings in (REGION_SETTINGS["region2"], REGION_SETTINGS["region3"], REGION_SETTINGS["region4"]):
        args = (256, 224, 90, 10**8, True, settings)
        ours = [fastjpeg.transform(data, *args) for data in batch]
        assert [r is None for r in ours] == [False] * 7 + [True]
        spec = fastjpeg._spec_args(*args)
        assert [testing.transform(data, *spec) for data in batch] == ours
        assert testing.transform_many(batch, *spec) == production.transform_many(batch, *spec) == ours


def _arithmetic_variants() -> list[tuple[str, bytes]]:
    """A photo's sequential arithmetic-coded copies (no restarts; a restart every 7 MCUs), ImageNet-size and large."""
    return [
        (f"{w}x{h} restart {r}", _testing().arithmetic(_jpeg(w, h, **save), r))
        for (w, h, save) in ((500, 375, {}), (2592, 1944, {}), (641, 479, {"subsampling": 0}))
        for r in (0, 7)
    ]


def test_arithmetic_coded_files_transform_to_the_huffman_files_bytes() -> None:
    """fast_arith (libjpeg's arithmetic decoder with its registers local) decodes the same coefficients: an
    arithmetic-coded copy transforms to exactly the bytes of the Huffman-coded file it was made from, at every DCT
    scale, and its pixels equal those of libjpeg's own arithmetic decoder (crop_resize flag 8) for any region."""
    for name, data in _arithmetic_variants():
        assert b"\xff\xc9" in data, name  # SOF9: sequential, arithmetic-coded
        assert fastjpeg.check(data) is not None, name
        w, h = Image.open(io.BytesIO(data)).size
        source = _jpeg(w, h, **({"subsampling": 0} if w == 641 else {}))
        assert transform_image(data, REGION3).data == transform_image(source, REGION3).data, name
        for num in (8, 4, 2, 1):
            sw, sh = -(-w * num // 8), -(-h * num // 8)
            region = (num, sw // 7, sh // 5, sw - sw // 9, sh - 3, sw / 7, sh / 5, sw - sw / 9, sh - 3.0, 64, 48)
            assert _compiled().crop_resize(data, *region, 0) == _compiled().crop_resize(data, *region, 8)


def _damaged_like_libjpeg(variants: list[tuple[str, bytes]], tries: int, seed: int) -> None:
    """Corrupt bytes, stray 0xFF and cuts in each of VARIANTS' entropy-coded data: the module's own entropy decoders
    give libjpeg's pixels or libjpeg's error (crop_resize flag 8: libjpeg's), file by file."""
    rng = np.random.default_rng(seed)
    for name, data in variants:
        w, h = Image.open(io.BytesIO(data)).size
        region = (8, 0, h // 4, w, h, 0.0, h / 4, float(w), float(h), 64, 64)
        for i in range(tries):
            broken = bytearray(data)
            at = int(rng.integers(len(data) // 3, len(data) - 2))
            if i % 3 == 0:
                broken[at] = int(rng.integers(256))
            elif i % 3 == 1:
                broken[at] = 0xFF
            else:
                broken = broken[:at]
            results = []
            for flags in (0, 8):
                try:
                    results.append(_compiled().crop_resize(bytes(broken), *region, flags))
                except ValueError as exc:
                    results.append(str(exc))
            assert results[0] == results[1], (name, i)


def test_a_broken_arithmetic_coded_file_fails_as_libjpegs_decoder_fails() -> None:
    """Corrupt bytes, stray 0xFF and cuts in the arithmetic-coded data: fast_arith gives libjpeg's pixels or libjpeg's
    error, file by file, and the transform refuses the cut ones as the Pillow path does."""
    _damaged_like_libjpeg(_arithmetic_variants()[:2], 40, 5)
    for _, data in _arithmetic_variants()[:2]:
        cut = data[: len(data) * 2 // 3]
        assert fastjpeg.check(cut) is None  # the UNCHANGED decode check reads to the end: it notices the cut
        assert _refusal(cut, REGION3).reason == _refusal(cut, PILLOW).reason == "corrupt"


def test_mpo_and_irregular_exif_take_one_call_with_the_orientation_pillow_read() -> None:
    """Files whose header the compiled call leaves to Pillow (MPO, two EXIF blocks) come back to it with the
    orientation and size Pillow read: the bytes crop_resize and Pillow's encoder write; a size that is not
    libjpeg's gives None."""
    settings = REGION_SETTINGS["region3"]
    frames = [photo_like(np.random.default_rng(s), 640, 480, np.array([0.4, 0.4, 0.2])) for s in (1, 2)]
    mpo = io.BytesIO()
    frames[0].save(mpo, "MPO", save_all=True, append_images=frames[1:], quality=92)
    oriented = _oriented(6)
    exif = b"\xff\xe1\x00\x16Exif\x00\x00II*\x00\x08\x00\x00\x00" + bytes(6)  # an EXIF block, empty IFD0
    at = oriented.index(b"\xff\xdb")  # the first quantisation table: after the file's own EXIF block
    two_exif = oriented[:at] + exif + oriented[at:]
    assert Image.open(io.BytesIO(two_exif)).getexif().get(0x0112) == 6
    for data in (mpo.getvalue(), two_exif):
        assert fastjpeg.transform(data, 256, 224, 90, 10**8, True, settings) is None
        size = Image.open(io.BytesIO(data)).size
        assert fastjpeg.transform(data, 256, 224, 90, 10**8, True, settings, 6, size) is not None
        assert fastjpeg.transform(data, 256, 224, 90, 10**8, True, settings, 6, (size[0] + 1, size[1])) is None
        assert transform_image(data, REGION3) == _through_pillow(data, REGION3)
    assert transform_image(two_exif, REGION3).src_width == 900  # upright: stored 600 x 900, turned


@pytest.mark.parametrize("kernel", ["triangle", "bicubic", "lanczos"])
def test_the_resampling_kernels_are_pillows(kernel: str) -> None:
    """At full scale with libjpeg's fancy chroma upsampling (what Pillow decodes), crop_resize with each kernel draws
    what Pillow's resize with that filter draws from the same box, up to Pillow's 8-bit intermediate rounding."""
    data = _jpeg(500, 375, seed=5)
    box, out = (37.25, 12.5, 437.25, 362.5), 224
    settings = fastjpeg.RegionSettings(fancy_upsampling=True, kernel=kernel)
    ours = fastjpeg.crop_resize(data, (500, 375), box, out, dct_scaling=False, settings=settings)
    pillow_filter = {"triangle": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}.get(
        kernel, Image.Resampling.LANCZOS
    )
    theirs = np.asarray(Image.open(io.BytesIO(data)).convert("RGB").resize((out, out), pillow_filter, box=box))
    diff = np.abs(np.frombuffer(ours, np.uint8).reshape(out, out, 3).astype(int) - theirs.astype(int))
    assert diff.max() <= (4 if kernel == "lanczos" else 2), diff.max()  # Pillow rounds to 8 bits between passes
    assert 10 * np.log10(255**2 / max(float(np.mean(diff.astype(float) ** 2)), 1e-12)) > 50


def test_region4_is_region3_with_the_bicubic_kernel_and_nearer_the_reference() -> None:
    """region4 changes the kernel of full-scale decodes only (the same decode, cut and geometry) and lands closer to
    the full-precision Lanczos reference there (ImageNet size); a file decoded at a reduced DCT scale (2 MP and more)
    gets region3's bytes."""
    assert replace(REGION_SETTINGS["region3"], kernel="bicubic") == REGION_SETTINGS["region4"]
    for data in (_jpeg(500, 375, seed=7), _jpeg(500, 375, seed=8, progressive=True), _jpeg(375, 500, seed=9)):
        ref = reference_pixels(data, REGION4)
        four, three = transform_image(data, REGION4), transform_image(data, REGION3)
        assert (four.width, four.height) == (three.width, three.height) == (224, 224)
        assert psnr(four.data, ref) > psnr(three.data, ref), "region4 no nearer the reference"
    large = _jpeg(2592, 1944, seed=2)  # decoded at 2/8
    assert transform_image(large, REGION4) == transform_image(large, REGION3)


def _progressive_variants() -> list[tuple[str, bytes]]:
    """Progressive Huffman files as encoders write them: Pillow's (libjpeg's default progression: two refinement
    scans of luma) in colour 4:2:0 / 4:4:4, grey and CMYK, optimised tables, quality 50 to 98, small and large."""
    out = []
    for name, (w, h), mode, save in (
        ("imagenet q90", (500, 375), "RGB", {"quality": 90}),
        ("q98 4:4:4", (641, 479), "RGB", {"quality": 98, "subsampling": 0}),
        ("q50 optimised", (333, 500), "RGB", {"quality": 50, "optimize": True}),
        ("grey", (400, 300), "L", {"quality": 85}),
        ("cmyk", (320, 240), "CMYK", {"quality": 92}),
        ("large", (2048, 1536), "RGB", {"quality": 88}),
        ("tiny", (17, 9), "RGB", {"quality": 75}),
    ):
        img = photo_like(np.random.default_rng(w), w, h, np.array([0.4, 0.35, 0.25])).convert(mode)
        buf = io.BytesIO()
        img.save(buf, "JPEG", progressive=True, **save)
        out.append((name, buf.getvalue()))
    return out


def test_the_refinement_scans_decode_to_libjpegs_coefficients() -> None:
    """fast_refine (the AC refinement scans with the block's nonzero coefficients as a bit mask) decodes the same
    coefficients as libjpeg's decode_mcu_AC_refine: every progressive file's pixels equal those of libjpeg's own
    decoders (crop_resize flag 8) at every DCT scale, whole image and region, and through the cut that stops before
    the last-bit scans (flag 4). test_fast_refine_decodes_the_refinement_scans checks that it ran."""
    for name, data in _progressive_variants():
        assert b"\xff\xc2" in data, name  # SOF2: progressive, Huffman-coded
        w, h = Image.open(io.BytesIO(data)).size
        for num in (8, 4, 2, 1):
            sw, sh = -(-w * num // 8), -(-h * num // 8)
            whole = (num, 0, 0, sw, sh, 0.0, 0.0, float(sw), float(sh), sw, sh)
            region = (num, sw // 7, sh // 5, sw - sw // 9, sh, sw / 7, sh / 5, sw - sw / 9, float(sh), 64, 48)
            top = max(9, sh // 2)  # a region ending halfway: the scans leave the rows below it undecoded
            upper = (num, sw // 7, 0, sw - sw // 9, top, sw / 7, 0.0, sw - sw / 9, float(top), 64, 48)
            for box in (whole, region, upper) if sw > 8 and sh > 8 else (whole,):
                for cut in (0, 4):
                    ours, libjpegs = (_compiled().crop_resize(data, *box, cut | flag) for flag in (0, 8))
                    assert ours == libjpegs, (name, num, box, cut)


def test_fast_refine_decodes_the_refinement_scans() -> None:
    """fast_refine decodes the refinement scans (libjpeg the last few MCUs of each, and none with crop_resize flag 8),
    and a region's decode leaves the MCUs below it undecoded (the counters of the testing module's refine_counts)."""
    hooks = _testing()
    hooks.refine_counts()
    for name, data in _progressive_variants():
        w, h = Image.open(io.BytesIO(data)).size
        hooks.refine_counts()
        hooks.crop_resize(data, 8, 0, 0, w, h, 0.0, 0.0, float(w), float(h), 16, 16, 8)
        assert hooks.refine_counts() == (0, 0, 0), name  # flag 8: libjpeg's own decoders, no hook
        hooks.crop_resize(data, 8, 0, 0, w, h, 0.0, 0.0, float(w), float(h), 16, 16, 0)
        fast, delegated, skipped = hooks.refine_counts()
        assert fast > (20 * delegated if w * h > 10_000 else 0), (name, fast, delegated)  # it ran: libjpeg the last few
        assert skipped == 0  # the whole image: every row decoded
        if h >= 256:  # tall enough for rows below the upper region's iMCU rows and their margin
            hooks.refine_counts()
            hooks.crop_resize(data, 8, 0, 0, w, h // 2, 0.0, 0.0, float(w), h / 2, 32, 32, 0)
            assert hooks.refine_counts()[2] > 0, name  # MCUs below the region left undecoded


def test_a_broken_progressive_file_fails_as_libjpegs_decoder_fails() -> None:
    """Corrupt bytes, stray 0xFF and cuts in the scans: fast_refine gives libjpeg's pixels or libjpeg's error, file
    by file (a marker, the end of the data or a bad code within reach leave the block to libjpeg)."""
    _damaged_like_libjpeg(_progressive_variants()[:3], 60, 6)
