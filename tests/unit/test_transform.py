"""The transform: output size, mode and decodability for every image mode; each bad-input reason."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from imgest.bench.transform_speed import baseline_transform, psnr, reference_pixels
from imgest.core.errors import ConfigError
from imgest.core.quarantine import BadImage
from imgest.sources.devdata.defects import awkward_images, broken_images
from imgest.sources.devdata.images import jpeg_bytes, photo_like
from imgest.transform.image import TransformSpec, center_crop_box, transform_image

SPEC = TransformSpec()


def _decode(data: bytes) -> Image.Image:
    img = Image.open(io.BytesIO(data))
    img.load()
    return img


@pytest.mark.parametrize("name", sorted(awkward_images()))
def test_every_awkward_mode_becomes_224_rgb_jpeg(name: str) -> None:
    data, _ = awkward_images()[name]
    out = transform_image(data, SPEC)
    img = _decode(out.data)
    assert img.format == "JPEG"
    assert img.mode == "RGB"
    assert img.size == (224, 224) == (out.width, out.height)
    assert np.asarray(img).std() > 5  # real picture content, not a flat or black square


@pytest.mark.parametrize("name", sorted(broken_images()))
def test_each_broken_file_gets_its_reason(name: str) -> None:
    data, reason = broken_images()[name]
    with pytest.raises(BadImage) as err:
        transform_image(data, SPEC)
    assert err.value.reason == reason
    with pytest.raises(BadImage) as err_unchanged:
        transform_image(data, TransformSpec(mode="unchanged"))
    assert err_unchanged.value.reason == reason


def test_png_content_in_jpeg_name_is_decoded_as_png() -> None:
    out = transform_image(awkward_images()["png_inside.JPEG"][0], SPEC)
    assert out.src_format == "PNG"


def test_16bit_png_is_scaled_not_clipped() -> None:
    gray16 = awkward_images()["gray16.png"][0]
    assert Image.open(io.BytesIO(gray16)).mode.startswith("I")
    pixels = np.asarray(_decode(transform_image(gray16, SPEC).data))
    assert 20 < pixels.mean() < 235  # clipping to 255 would make it (almost) white


def test_transparency_is_composited_on_white() -> None:
    img = Image.new("RGBA", (300, 300), (0, 0, 0, 0))  # fully transparent black
    buf = io.BytesIO()
    img.save(buf, "PNG")
    pixels = np.asarray(_decode(transform_image(buf.getvalue(), SPEC).data))
    assert pixels.min() >= 250


def test_cmyk_colours_survive() -> None:
    rgb = Image.new("RGB", (400, 300), (200, 30, 30))
    buf = io.BytesIO()
    rgb.convert("CMYK").save(buf, "JPEG", quality=95)
    r, g, b = np.asarray(_decode(transform_image(buf.getvalue(), SPEC).data)).reshape(-1, 3).mean(axis=0)
    assert r > 150
    assert g < 80
    assert b < 80


def test_exif_orientation_is_applied() -> None:
    # 400x300 landscape stored pixels: left half red, right half blue; orientation 6 = display rotated 90 CW
    img = Image.new("RGB", (400, 300), (255, 0, 0))
    img.paste((0, 0, 255), (200, 0, 400, 300))
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=95, exif=exif.tobytes())
    out = transform_image(buf.getvalue(), SPEC)
    assert (out.src_width, out.src_height) == (300, 400)  # upright portrait
    pixels = np.asarray(_decode(out.data)).astype(int)
    top, bottom = pixels[:40].mean(axis=(0, 1)), pixels[-40:].mean(axis=(0, 1))
    assert top[0] > 200  # rotated CW: the red left half is now on top
    assert top[2] < 60
    assert bottom[2] > 200
    assert bottom[0] < 60


def test_unchanged_mode_returns_original_bytes() -> None:
    data = jpeg_bytes(np.random.default_rng(3), np.array([0.1, 0.2, 0.3]), large=False)
    out = transform_image(data, TransformSpec(mode="unchanged"))
    assert out.data is data
    assert (out.width, out.height) == Image.open(io.BytesIO(data)).size
    assert out.ext == "jpg"


def test_bomb_limit_is_configurable() -> None:
    data = jpeg_bytes(np.random.default_rng(4), np.array([0.5, 0.5, 0.5]), large=False)
    with pytest.raises(BadImage, match="too-large"):
        transform_image(data, TransformSpec(max_pixels=100_000))


def test_bomb_never_decodes(tmp_path) -> None:
    """A 400-megapixel PNG is rejected from its header: the process's peak memory stays small."""
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(broken_images()["bomb.png"][0])
    code = (
        "import resource, sys; from imgest.transform.image import transform_image, TransformSpec\n"
        "from imgest.core.quarantine import BadImage\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"data = open({str(bomb)!r}, 'rb').read()\n"
        "try:\n    transform_image(data, TransformSpec())\nexcept BadImage as e:\n    print(e.reason)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "too-large"
    assert int(out[1]) < 50  # MiB of growth; decoding would need 400 MiB


@pytest.mark.parametrize(("size", "large"), [((500, 375), False), ((2592, 1944), True)])
def test_quality_matches_plain_pipeline(size: tuple[int, int], large: bool) -> None:
    """DCT scaling and the one-pass crop keep quality: within 1 dB of the plain pipeline vs a reference."""
    rng = np.random.default_rng(11)
    buf = io.BytesIO()
    photo_like(rng, *size, np.array([0.4, 0.2, 0.6])).save(buf, "JPEG", quality=92)
    data = buf.getvalue()
    ref = reference_pixels(data, SPEC)
    ours, plain = psnr(transform_image(data, SPEC).data, ref), psnr(baseline_transform(data, SPEC), ref)
    assert ours > 30
    assert ours > plain - 1.0


def test_center_crop_box_matches_resize_then_crop() -> None:
    # 500x375 -> shorter side 256 gives 341x256; the centred 224 crop of that starts at (58, 16).
    left, top, right, bottom = center_crop_box(500, 375, 256, 224, exact=True)
    sx, sy = 500 / 341, 375 / 256  # each axis its own scale: exactly that resize, then the crop
    assert (left, top, right, bottom) == pytest.approx((58 * sx, 16 * sy, 282 * sx, 240 * sy))
    # The Pillow path's box (one scale for both axes) stays what it always was: old versions verify byte for byte.
    scale = 256 / 375
    assert center_crop_box(500, 375, 256, 224) == pytest.approx((58 / scale, 16 / scale, 282 / scale, 240 / scale))


@pytest.mark.parametrize("kwargs", [{"crop": 300}, {"quality": 0}, {"mode": "png"}, {"max_pixels": 0}])
def test_bad_settings_are_config_errors(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        TransformSpec(**kwargs)


HEADER_ONLY = TransformSpec(mode="unchanged", unchanged_check="header")


@pytest.mark.parametrize("name", sorted(broken_images()))
def test_header_only_check_refuses_every_broken_file(name: str) -> None:
    data, reason = broken_images()[name]
    with pytest.raises(BadImage) as err:
        transform_image(data, HEADER_ONLY)
    assert err.value.reason == reason


@pytest.mark.parametrize("cut", [1, 2, 500, 5000])
def test_header_only_check_refuses_a_truncated_jpeg_and_png(cut: int) -> None:
    img = photo_like(np.random.default_rng(4), 300, 200, np.array([0.3, 0.2, 0.1]))
    for fmt in ("JPEG", "PNG"):
        out = io.BytesIO()
        img.save(out, fmt)
        whole = out.getvalue()
        assert transform_image(whole, HEADER_ONLY).data is whole
        with pytest.raises(BadImage, match="truncated") as err:
            transform_image(whole[:-cut], HEADER_ONLY)
        assert err.value.reason == "corrupt"


def test_header_only_check_keeps_bytes_after_the_end_marker() -> None:
    data = jpeg_bytes(np.random.default_rng(5), np.array([0.1, 0.2, 0.3]), large=False) + b"\x00" * 64
    out = transform_image(data, HEADER_ONLY)
    assert out.data is data
    assert (out.width, out.height) == Image.open(io.BytesIO(data)).size


def test_unknown_unchanged_check_is_refused() -> None:
    with pytest.raises(ConfigError, match="unchanged check"):
        TransformSpec(mode="unchanged", unchanged_check="none")  # type: ignore[arg-type]


def _apng_with_a_frame_sequence_error() -> bytes:
    """A two-frame APNG whose second frame lost its control chunk (fcTL), like Pillow's own chunk_no_fctl.png:
    Pillow opens it, and raises SyntaxError only when it reads past the first frame's pixels (the EXIF lookup)."""
    import struct
    import zlib

    frames = [Image.new("RGB", (300, 260), c) for c in ((200, 0, 0), (0, 200, 0))]
    buf = io.BytesIO()
    frames[0].save(buf, "PNG", save_all=True, append_images=frames[1:])
    data, out, pos, controls = buf.getvalue(), bytearray(buf.getvalue()[:8]), 8, 0
    while pos < len(data):
        size, kind = struct.unpack(">I", data[pos : pos + 4])[0], data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + size]
        pos += 12 + size
        controls += kind == b"fcTL"
        if kind == b"fcTL" and controls == 2:
            continue
        out += struct.pack(">I", size) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    return bytes(out)


def test_a_file_pillow_opens_but_fails_to_read_later_is_quarantined_not_raised() -> None:
    with pytest.raises(BadImage) as bad:
        transform_image(_apng_with_a_frame_sequence_error(), TransformSpec())
    assert bad.value.reason == "corrupt"
    assert "SyntaxError" in bad.value.detail
