"""The image transform the ingest jobs apply: a pure bytes -> bytes function.

JPEG mode: decode -> RGB -> resize the shorter side to S -> center-crop C -> encode JPEG quality Q.
UNCHANGED mode: the original bytes, after checking that they decode (or, with unchanged_check="header",
that the header parses and the end marker is there: several times faster, but a corrupt middle passes).

How it is fast without losing quality:
- With jpeg_decoder="region4" (the default where it is built), JPEGs (and MPO's first frame) go through
  imgest.transform.fastjpeg: only the crop's region is decoded (libjpeg-turbo, SIMD DCT scales, the decoded
  crop kept at least 2x the output; see REGION_SETTINGS) and resampled straight to C x C; EXIF orientation
  turns the crop box into stored coordinates and the small output afterwards; CMYK / YCCK convert as Pillow
  converts them. For a JPEG the whole transform (header, orientation, decode, resample, turn, encode) is one
  compiled call, without a Pillow image. The UNCHANGED decode check runs its entropy decoder alone. Any file it
  doubts takes the Pillow path below, which decides and words every quarantine reason; one whose header it leaves
  to Pillow (MPO, irregular EXIF) comes back to the one call with the orientation Pillow read. Earlier revisions
  are kept so that versions they wrote re-transform byte for byte: "region" (RGB / grey upright JPEGs only, scaled
  as far as the output allowed), "region2" (region3 reading every scan of progressive files) and "region3"
  (region4 with the bilinear kernel, torchvision's).
- On the Pillow path, JPEG sources are decoded with libjpeg's DCT-domain downscaling (Pillow's draft
  mode) by the largest power of two that still leaves the shorter side at least S, so the final resample
  never upsamples what DCT scaling took away. Images of several megapixels decode 4-8x smaller.
- Resize and crop are one resample: only the source box that lands inside the C x C crop is resampled,
  straight to C x C, instead of resampling the whole image and then copying the crop out.

Colour and mode policy (every mode real datasets contain):
- CMYK / YCCK JPEGs (Adobe inverted included), grayscale (L, 1), palette (P), 16-bit (I;16, I) and
  RGB images all become 8-bit RGB; 16-bit samples are scaled (v >> 8), not clipped.
- Alpha (RGBA, LA, PA, P with transparency) is composited onto white.
- The file's content decides the decoder, not its extension: PNG bytes in a .JPEG file are decoded as PNG.
- EXIF orientation is applied in JPEG mode (the pixels come out upright, and the output carries no
  EXIF), which matches DALI's decoders (``adjust_orientation=True`` by default) reading UNCHANGED bytes.
- Images above ``max_pixels`` are rejected from the header alone, before any pixel is decoded.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, UnidentifiedImageError

from imgest.core.quarantine import BadImage, Reason
from imgest.transform import fastjpeg
from imgest.transform.revisions import ONE_CALL_DECODERS, REGION_DECODERS, REGION_SETTINGS
from imgest.transform.spec import Check, Mode, TransformSpec  # re-exported: callers name it imgest.transform.image's

__all__ = ["Check", "Mode", "TransformSpec", "Transformed", "transform_image"]

# A complete file's last marker and the bytes that must follow it (PNG: the IEND chunk's CRC); more bytes
# after it (padding, appended data) are tolerated.
END_MARKERS = {"JPEG": (b"\xff\xd9", 0), "PNG": (b"IEND", 4)}
END_WINDOW = 4096
EXIF_ORIENTATION = 0x0112
# EXIF orientation -> the transpose that makes the pixels upright (as ImageOps.exif_transpose does).
ORIENTATION_FIX = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
RESAMPLE = Image.Resampling.BILINEAR  # torchvision's Resize default, antialiased when downscaling


@dataclass(frozen=True)
class Transformed:
    """The bytes to store and what is known about them."""

    data: bytes
    width: int
    height: int
    src_width: int
    src_height: int
    src_format: str
    ext: str


SIGNATURES = (
    (b"\xff\xd8\xff", "JPEG"),
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
)


def image_signature(data: bytes) -> str | None:
    """The image format whose magic number DATA starts with, if any (WebP: RIFF....WEBP)."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return next((fmt for magic, fmt in SIGNATURES if data.startswith(magic)), None)


def open_checked(data: bytes, max_pixels: int) -> Image.Image:
    """Open DATA lazily (header only); reject empty, non-image and over-sized input."""
    if not data:
        raise BadImage(Reason.EMPTY, "0 bytes")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        fmt = image_signature(data)
        if fmt:
            raise BadImage(Reason.CORRUPT, f"{fmt} signature but unreadable header (starts {data[:8]!r})") from None
        raise BadImage(Reason.NOT_AN_IMAGE, f"not a recognised image format (starts {data[:8]!r})") from None
    except Image.DecompressionBombError as exc:
        raise BadImage(Reason.TOO_LARGE, f"{exc} (imgest limit {max_pixels} pixels)") from None
    except Exception as exc:  # Pillow raises many types for broken headers
        raise BadImage(Reason.CORRUPT, f"unreadable header: {type(exc).__name__}: {exc}") from None
    width, height = img.size
    if width * height > max_pixels:
        raise BadImage(Reason.TOO_LARGE, f"{width}x{height} = {width * height} pixels > limit {max_pixels}")
    if width < 1 or height < 1:
        raise BadImage(Reason.CORRUPT, f"invalid size {width}x{height}")
    return img


def _load(img: Image.Image) -> None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img.load()
    except Exception as exc:  # truncated data, bad Huffman codes, CRC errors, ...
        raise BadImage(Reason.CORRUPT, f"decode failed: {type(exc).__name__}: {exc}") from None


def to_rgb(img: Image.Image) -> Image.Image:
    """8-bit RGB for any Pillow mode (see the module docstring for the policy)."""
    if img.mode == "RGB":
        return img
    if img.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        arr = np.asarray(img, dtype=np.uint32 if img.mode == "I" else np.uint16)
        shift = 8 if img.mode != "I" or arr.max(initial=0) > 255 else 0
        img = Image.fromarray((arr >> shift).clip(0, 255).astype(np.uint8), "L")
    if img.mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    if img.mode in ("RGBA", "LA", "PA", "La", "RGBa"):
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return img.convert("RGB")


def has_end_marker(data: bytes, src_format: str) -> bool:
    """Whether a JPEG or PNG has its end marker among its last bytes (True for other formats)."""
    if src_format not in END_MARKERS:
        return True
    marker, after = END_MARKERS[src_format]
    tail = data[-END_WINDOW:]
    at = tail.rfind(marker)
    return at >= 0 and len(tail) - at - len(marker) >= after


def check_end_marker(data: bytes, src_format: str) -> None:
    """Refuse a JPEG or PNG whose end marker is missing from its last bytes (a truncated file)."""
    if not has_end_marker(data, src_format):
        marker = END_MARKERS[src_format][0]
        raise BadImage(Reason.CORRUPT, f"{src_format} without its end marker {marker!r}: truncated")


def center_crop_box(
    width: int, height: int, resize: int, crop: int, exact: bool = False
) -> tuple[float, float, float, float]:
    """Box in source pixels that 'resize shorter side to RESIZE, center-crop CROP' keeps (pure).

    EXACT: the resize goes to whole pixels (the longer side rounded), so each axis has its own scale, as resizing
    to that size and cutting the crop out would; the output lines up with that reference pixel for pixel (the
    region decoder uses it). Otherwise one scale for both axes: the box the Pillow path has always used, kept so
    that versions it wrote re-transform byte for byte.
    """
    scale = resize / min(width, height)
    rw, rh = max(resize, round(width * scale)), max(resize, round(height * scale))
    sx, sy = (width / rw, height / rh) if exact else (1 / scale, 1 / scale)
    left, top = round((rw - crop) / 2), round((rh - crop) / 2)
    return (left * sx, top * sy, (left + crop) * sx, (top + crop) * sy)


def _encode(img: Image.Image, quality: int) -> bytes:
    out = io.BytesIO()
    img.save(out, "JPEG", quality=quality)
    return out.getvalue()


def stored_box(box: tuple[float, float, float, float], size: tuple[int, int], orientation: int) -> tuple[float, ...]:
    """BOX, given in the upright picture, in the coordinates of the pixels as stored (SIZE = stored width, height)
    under EXIF ORIENTATION: resampling that to C x C and applying ORIENTATION_FIX gives the upright crop (pure)."""
    left, top, right, bottom = box
    w, h = size
    return {
        2: (w - right, top, w - left, bottom),
        3: (w - right, h - bottom, w - left, h - top),
        4: (left, h - bottom, right, h - top),
        5: (top, left, bottom, right),
        6: (top, h - right, bottom, h - left),
        7: (w - bottom, h - right, w - top, h - left),
        8: (w - bottom, left, w - top, right),
    }.get(orientation, box)


def _fast_jpeg(
    data: bytes, img: Image.Image, orientation: int, spec: TransformSpec, one_call: bool = True
) -> bytes | None:
    """The compiled region decode + resample, when it applies; else None. "region" (the first revision) takes
    upright YCbCr / grey JPEGs only; "region2" to "region4" also oriented, CMYK / YCCK and MPO (its first frame),
    in one compiled call with the orientation Pillow read (ONE_CALL False: crop_resize, then Pillow turns and
    encodes, as region2 first ran: the same bytes, the tests' reference).

    Anything it refuses (a truncated or broken file) goes back to the Pillow path, which decides with its own
    wording, so both paths quarantine exactly the same files.
    """
    if spec.jpeg_decoder == "region":
        if img.format != "JPEG" or img.mode not in ("RGB", "L") or orientation != 1:
            return None
    elif (
        spec.jpeg_decoder not in ONE_CALL_DECODERS
        or img.format not in ("JPEG", "MPO")
        or img.mode not in ("RGB", "L", "CMYK")
    ):
        return None
    if not has_end_marker(data, "JPEG"):  # the fast path does not read the rows below the crop
        return None
    fix = ORIENTATION_FIX.get(orientation)
    if one_call and spec.jpeg_decoder in ONE_CALL_DECODERS:
        done = _one_call(data, spec, orientation if fix is not None else 1, img.size)
        if done is not None:
            return done[0]
    upright = img.size[::-1] if orientation in (5, 6, 7, 8) else img.size
    box = center_crop_box(*upright, spec.resize, spec.crop, exact=True)
    if fix is not None:
        box = stored_box(box, img.size, orientation)  # type: ignore[assignment]
    try:
        pixels = fastjpeg.crop_resize(
            data, img.size, box, spec.crop, spec.dct_scaling, REGION_SETTINGS[spec.jpeg_decoder]
        )
    except ValueError:
        return None
    out = Image.frombuffer("RGB", (spec.crop, spec.crop), pixels, "raw", "RGB", 0, 1)
    return _encode(out if fix is None else out.transpose(fix), spec.quality)


def _one_call(
    data: bytes, spec: TransformSpec, orientation: int = 0, size: tuple[int, int] = (0, 0)
) -> tuple[bytes, int, int] | None:
    """fastjpeg.transform with SPEC's settings (ORIENTATION and SIZE as Pillow read them, when it opened the file)."""
    return fastjpeg.transform(
        data,
        spec.resize,
        spec.crop,
        spec.quality,
        min(spec.max_pixels, Image.MAX_IMAGE_PIXELS or spec.max_pixels),
        spec.dct_scaling,
        REGION_SETTINGS[spec.jpeg_decoder],
        orientation,
        size,
    )


def _region_checked(data: bytes, max_pixels: int) -> Transformed | None:
    """UNCHANGED with the decode check, for a JPEG the region decoder's library reads to its end within the pixel
    limits; None (anything else, or any doubt) leaves the file to the Pillow path, which decides and words it."""
    if image_signature(data) != "JPEG":
        return None
    size = fastjpeg.check(data, min(max_pixels, Image.MAX_IMAGE_PIXELS or max_pixels))
    if size is None or min(size) < 1:
        return None
    return Transformed(data, *size, *size, "JPEG", "jpg")


def _header_checked(data: bytes, max_pixels: int) -> Transformed | None:
    """UNCHANGED with the header check, for a JPEG whose header libjpeg reads (markers up to the first scan) within
    the pixel limits and which ends with its end marker; None (anything else, or any doubt) leaves the file to the
    Pillow path, which decides and words it. libjpeg's header read costs a tenth of Pillow's marker walk in Python."""
    if image_signature(data) != "JPEG" or not has_end_marker(data, "JPEG"):
        return None
    size = fastjpeg.header(data)
    if size is None or min(size) < 1 or size[0] * size[1] > min(max_pixels, Image.MAX_IMAGE_PIXELS or max_pixels):
        return None
    return Transformed(data, *size, *size, "JPEG", "jpg")


def transform_image(data: bytes, spec: TransformSpec) -> Transformed:
    """Apply SPEC to one encoded image; raises BadImage with a quarantine reason."""
    if spec.mode == "unchanged" and spec.jpeg_decoder in REGION_DECODERS:
        checked = (_region_checked if spec.unchanged_check == "decode" else _header_checked)(data, spec.max_pixels)
        if checked is not None:
            return checked
    if spec.mode == "jpeg" and spec.jpeg_decoder in ONE_CALL_DECODERS:
        done = _one_call(data, spec)
        if done is not None:
            return Transformed(done[0], spec.crop, spec.crop, done[1], done[2], "JPEG", "jpg")
    img = open_checked(data, spec.max_pixels)
    try:
        return _transform_opened(data, img, spec)
    except BadImage:
        raise
    except Exception as exc:  # Pillow raises SyntaxError, OSError, EOFError, ValueError past open() on broken files
        raise BadImage(Reason.CORRUPT, f"decode failed: {type(exc).__name__}: {exc}") from None


def _transform_opened(data: bytes, img: Image.Image, spec: TransformSpec, one_call: bool = True) -> Transformed:
    """transform_image once the header is accepted (IMG opened from DATA); ONE_CALL: see _fast_jpeg."""
    src_format = img.format or "unknown"
    src_w, src_h = img.size
    if spec.mode == "unchanged":
        if spec.unchanged_check == "header":
            check_end_marker(data, src_format)
        else:
            if src_format == "JPEG":
                img.draft(img.mode, (max(1, src_w // 8), max(1, src_h // 8)))  # all entropy data is still decoded
            _load(img)
        ext = "jpg" if src_format == "JPEG" else src_format.lower()
        return Transformed(data, src_w, src_h, src_w, src_h, src_format, ext)

    orientation = img.getexif().get(EXIF_ORIENTATION, 1) if src_format in ("JPEG", "TIFF", "WEBP", "PNG") else 1
    fast = _fast_jpeg(data, img, orientation, spec, one_call)
    if fast is not None:
        upright = (src_h, src_w) if orientation in (5, 6, 7, 8) else (src_w, src_h)  # as the Pillow path records
        return Transformed(fast, spec.crop, spec.crop, *upright, src_format, "jpg")
    if spec.dct_scaling and src_format == "JPEG":
        scale = spec.resize / min(src_w, src_h)
        img.draft("RGB" if img.mode == "RGB" else None, (int(src_w * scale) + 1, int(src_h * scale) + 1))
    _load(img)  # the first frame of an animation or layered file: open() leaves it current (PSD's is 1, not 0)
    img = to_rgb(img)
    if orientation in ORIENTATION_FIX:
        img = img.transpose(ORIENTATION_FIX[orientation])
        if orientation in (5, 6, 7, 8):
            src_w, src_h = src_h, src_w
    k = img.size[0] / src_w  # DCT scaling factor actually applied
    box = tuple(v * k for v in center_crop_box(src_w, src_h, spec.resize, spec.crop))
    out_img = img.resize((spec.crop, spec.crop), RESAMPLE, box=box)
    return Transformed(_encode(out_img, spec.quality), spec.crop, spec.crop, src_w, src_h, src_format, "jpg")
