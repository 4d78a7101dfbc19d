"""The compiled JPEG fast path (``_fastjpeg``, built by setup.py against libjpeg-turbo when its headers exist).

For a center crop it decodes only the region the crop keeps, at libjpeg's DCT scale M/8, and resamples that
region straight to the output size with Pillow's BILINEAR filter in float. M is the smallest of 1, 2, 4, 8 that
keeps the crop at least RegionSettings.min_ratio times the output (1 in the first revision, which aliased at 1/8;
2 since: issue 27); those are the scales libjpeg-turbo has SIMD inverse DCTs for: 6/8 in plain C measured slower
than 8/8 with SIMD, and blurrier. Each revision's RegionSettings fix its output bytes. Rows above the region
are entropy-decoded and skipped; rows below it are not read at all, so the caller checks that the file ends with
its end marker (a truncated file is refused either way). From region3 on, a progressive file decoded at a reduced
scale also leaves unread the scans that refine the AC coefficients' last bit (the caller's end-marker check still
holds; a corrupt byte inside those scans goes unnoticed, as one in the rows below the region does).

``transform`` runs the whole JPEG -> JPEG transform in one call (header, EXIF / XMP orientation, region decode,
resample, turn, and the encoding Pillow's JPEG encoder would do), and ``transform_many`` a batch of them without
the GIL.

Sequential arithmetic-coded JPEGs are entropy-decoded by the module's own copy of libjpeg's arithmetic decoder
(``fast_arith`` in fastjpeg/arith.c: the same algorithm and results with its registers kept local, about 1.3x faster;
issue 27 found those files, 7 % of the real ImageNet-size set, taking 35 % of imgest's time there). Every decoder
revision benefits, with unchanged output bytes.

Without the compiled module the Pillow path in image.py does the same transform, slower; ``available()`` says
which one runs, and the benchmark prints it. Under spark-submit with ``--py-files`` the package is imported from a
zip, from which an extension module cannot load: the loader then takes the one of the installed package.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Literal

MODULE = "imgest.transform._fastjpeg"
BUILD_HINT = "install libjpeg-turbo's headers (Debian: apt-get install libjpeg-dev) and reinstall imgest"


def _package_folders() -> list[Path]:
    """Folders that hold an installed imgest package: sys.path entries, and the locations the import system's
    finders know (an editable install maps the package through a finder, not through sys.path)."""
    folders = [Path(entry or ".") / "imgest" for entry in sys.path]
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        try:
            spec = find_spec("imgest", None) if find_spec else None
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            folders += [Path(location) for location in spec.submodule_search_locations]
    return [folder for folder in dict.fromkeys(folders) if folder.is_dir()]


def _from_installed() -> ModuleType | None:
    """The compiled module from an installed (unzipped) imgest, for when this package runs from a zip."""
    for folder in _package_folders():
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = folder / "transform" / f"_fastjpeg{suffix}"
            if path.is_file():
                spec = importlib.util.spec_from_file_location(MODULE, path)
                if spec is None or spec.loader is None:
                    continue
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                return module
    return None


def _load() -> ModuleType | None:
    try:
        from imgest.transform import _fastjpeg  # type: ignore[attr-defined]

        return _fastjpeg  # type: ignore[no-any-return]
    except ImportError:
        return _from_installed()


_module = _load()


def available() -> bool:
    """Whether the compiled fast path is in use."""
    return _module is not None


def default_decoder() -> Literal["region", "region2", "region3", "region4", "pillow"]:
    """The JPEG decoder a TransformSpec uses unless told: the latest region decoder where the compiled module is
    built."""
    return "region4" if _module is not None else "pillow"


def library_version() -> str | None:
    """The libjpeg-turbo version the compiled module was built against (None without it)."""
    number = getattr(_module, "LIBJPEG_TURBO_VERSION_NUMBER", None)
    if number is None:
        return None
    return f"{number // 1000000}.{number // 1000 % 1000}.{number % 1000}"


def machine_fields() -> dict[str, str | None]:
    """What a benchmark's machine record says of the transform: the default JPEG decoder and libjpeg-turbo."""
    return {"jpeg_decoder": default_decoder(), "libjpeg_turbo": library_version()}


def check(data: bytes, max_pixels: int = 0) -> tuple[int, int] | None:
    """(width, height) if the JPEG DATA entropy-decodes to its end (no pixels rebuilt); None: unknown, ask Pillow.

    None is returned without the compiled module, for a file libjpeg refuses, and (decoding nothing) for one
    whose header says more than MAX_PIXELS, so the Pillow path then decides and words the quarantine reason,
    exactly as it does without the fast path.
    """
    if _module is None:
        return None
    try:
        size: tuple[int, int] | None = _module.check(data, max_pixels)
    except ValueError:
        return None
    return size


def header(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the JPEG DATA's header, read up to its first scan with nothing decoded; None: unknown
    (no compiled module, or a header libjpeg refuses), ask Pillow."""
    if _module is None:
        return None
    try:
        size: tuple[int, int] = _module.header(data)
    except ValueError:
        return None
    return size


NO_FANCY_UPSAMPLING = 1  # crop_resize flag: libjpeg's box chroma upsampling (merged with the colour conversion)
NO_LAST_AC_BITS = 4  # crop_resize flag: progressive files stop before the scans refining the AC coefficients' last bit


@dataclass(frozen=True)
class RegionSettings:
    """What one revision of the region decoder decides (its output bytes follow from these)."""

    # The decoded crop stays at least this many times the output side (see scale_eighths).
    min_ratio: float = 1.0
    # When the DCT scale reduced (M < 8), the bilinear filter's width is this fraction of the downscale factor
    # (0: not narrowed): the DCT scaling has already low-passed the pixels, and the full width blurs twice.
    narrow_when_reduced: float = 0.0
    # libjpeg's triangle ("fancy") chroma upsampling; off: box, merged with the colour conversion, where the
    # crop is downscaled (a picture smaller than the output keeps the triangle: box chroma would show).
    fancy_upsampling: bool = True
    # Progressive JPEGs decoded at a reduced DCT scale (M < 8): read the scans that refine the last bit of the AC
    # coefficients (the last and largest scans of libjpeg's progression). Off: stop before the first of them once
    # every component's AC coefficients had their first pass, for 38 % less decoding at 0.02 dB (issue 27).
    last_ac_bits_when_reduced: bool = True
    # The resampling kernel (Pillow's definitions) of a decode at full scale (M = 8): "triangle" (BILINEAR,
    # torchvision's antialiased default), "bicubic" or "lanczos". A reduced decode (M < 8) keeps the (narrowed)
    # triangle: the DCT scaling has already low-passed, and a sharper kernel there put a few real photos of 2 MP
    # and more below Pillow's pipeline (worst -0.55 dB, issue 44).
    kernel: str = "triangle"


KERNELS = {"triangle": 0, "bicubic": 1, "lanczos": 2}  # the compiled module's kernel codes
KERNEL_FLAG_SHIFT = 4  # crop_resize's flags carry the kernel's code in bits 4-5
FIRST = RegionSettings()


def scale_eighths(box_side: float, out_side: int, dct_scaling: bool, min_ratio: float = 1.0) -> int:
    """The DCT scale M (of M/8) to decode at: the smallest of 1, 2, 4, 8 that keeps BOX_SIDE source pixels
    at least MIN_RATIO x OUT_SIDE (8 without DCT scaling)."""
    if not dct_scaling:
        return 8
    return next((m for m in (1, 2, 4) if box_side * m / 8 >= min_ratio * out_side - 1e-9), 8)


def crop_resize(
    data: bytes,
    size: tuple[int, int],
    box: tuple[float, float, float, float],
    out: int,
    dct_scaling: bool = True,
    settings: RegionSettings | None = None,
) -> bytes:
    """RGB bytes (OUT x OUT) of the source BOX of the JPEG DATA (SIZE = its width, height); ValueError if bad.

    SETTINGS: the decoder revision's choices (default: the first revision's). CMYK and YCCK sources are
    converted as Pillow converts them (Adobe's inverted samples)."""
    if _module is None:
        raise RuntimeError(f"the compiled JPEG fast path is not built: {BUILD_HINT}")
    settings = settings or FIRST
    width, height = size
    m = scale_eighths(min(box[2] - box[0], box[3] - box[1]), out, dct_scaling, settings.min_ratio)
    k = m / 8
    scaled_w, scaled_h = math.ceil(width * k), math.ceil(height * k)
    bx0, by0, bx1, by1 = (v * k for v in box)
    margin = math.ceil(max(bx1 - bx0, by1 - by0) / out) + 1  # the filter's reach beyond the box, in pixels
    x0, y0 = max(0, math.floor(bx0) - margin), max(0, math.floor(by0) - margin)
    x1, y1 = min(scaled_w, math.ceil(bx1) + margin), min(scaled_h, math.ceil(by1) + margin)
    downscaled = min(bx1 - bx0, by1 - by0) >= out
    flags = 0 if settings.fancy_upsampling or not downscaled else NO_FANCY_UPSAMPLING
    if m < 8 and not settings.last_ac_bits_when_reduced:
        flags |= NO_LAST_AC_BITS
    if m == 8:
        flags |= KERNELS[settings.kernel] << KERNEL_FLAG_SHIFT
    narrow = settings.narrow_when_reduced if m < 8 else 0.0
    result: bytes = _module.crop_resize(data, m, x0, y0, x1, y1, bx0, by0, bx1, by1, out, out, flags, narrow)
    return result


def _spec_args(
    resize: int, crop: int, quality: int, max_pixels: int, dct_scaling: bool, settings: RegionSettings
) -> tuple[int, int, int, float, int, float, float, int, int, int]:
    return (
        resize,
        crop,
        quality,
        float(max_pixels),
        int(dct_scaling),
        settings.min_ratio,
        settings.narrow_when_reduced,
        int(settings.fancy_upsampling),
        int(settings.last_ac_bits_when_reduced),
        KERNELS[settings.kernel],
    )


def transform(
    data: bytes,
    resize: int,
    crop: int,
    quality: int,
    max_pixels: int,
    dct_scaling: bool,
    settings: RegionSettings,
    orientation: int = 0,
    size: tuple[int, int] = (0, 0),
) -> tuple[bytes, int, int] | None:
    """The whole JPEG transform in one compiled call: (JPEG bytes, upright source width, height), or None.

    The pixels are crop_resize's for the box image.py computes (EXIF / XMP orientation applied as Pillow reads it),
    encoded as Pillow's JPEG encoder does at QUALITY, without a Pillow image. None (nothing decided) for what the
    Pillow path must judge: not a JPEG, no end marker, more than MAX_PIXELS, MPO, EXIF that Pillow might read
    otherwise (several blocks, irregular entries), or any libjpeg error or warning of a truncated file.

    ORIENTATION (1-8) and SIZE: the EXIF orientation and stored size Pillow read, for the files whose header the
    compiled path leaves to Pillow (MPO, irregular EXIF): the header's orientation is then not read, and a size
    that is not libjpeg's too gives None."""
    if _module is None:
        return None
    result: tuple[bytes, int, int] | None = _module.transform(
        data, *_spec_args(resize, crop, quality, max_pixels, dct_scaling, settings), orientation, *size
    )
    return result


def transform_many(
    batch: list[bytes],
    resize: int,
    crop: int,
    quality: int,
    max_pixels: int,
    dct_scaling: bool,
    settings: RegionSettings,
) -> list[tuple[bytes, int, int] | None]:
    """transform() of every JPEG in BATCH in one call that holds no GIL while it works (same values, same order)."""
    if _module is None:
        return [None] * len(batch)
    results: list[tuple[bytes, int, int] | None] = _module.transform_many(
        batch, *_spec_args(resize, crop, quality, max_pixels, dct_scaling, settings)
    )
    return results
