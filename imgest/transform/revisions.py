"""The revisions of the region decoder: what each decides (its output bytes follow from these). A dataset version
records the revision that wrote it, so every revision stays, byte for byte."""

from __future__ import annotations

from typing import Literal

from imgest.transform import fastjpeg

Decoder = Literal["region", "region2", "region3", "region4", "pillow"]
REGION_DECODERS = ("region", "region2", "region3", "region4")
# What a user chooses, by behaviour (the CLI's --jpeg-decoder, the form's "JPEG decoder"), and what each does. A
# choice resolves to the revision a version records (resolve_decoder), so "fast" keeps meaning the bytes it wrote.
DECODER_CHOICES = {
    "auto": "fast where its compiled module is built, else pillow (the default)",
    "fast": "imgest's compiled decoder: decodes only the crop's region, at reduced DCT scale when the output allows, "
    "resampled with Pillow's bicubic kernel (region4)",
    "fast-bilinear": "the same with a bilinear kernel, like torchvision's Resize (region3)",
    "pillow": "Pillow's decode and resize, every pixel decoded",
}
# The revisions by name (versions record them; earlier runs and scripts may still say them).
DECODER_ALIASES = {"region4": "fast", "region3": "fast-bilinear", "region2": "", "region": ""}
# The trigger form's choices: the behaviours, and the two revision names its earlier versions offered.
DECODER_FORM = {
    "auto": "auto (fast where built, else pillow)",
    "fast": "fast (imgest's region decoder, bicubic)",
    "fast-bilinear": "fast-bilinear (imgest's region decoder, bilinear like torchvision)",
    "pillow": "pillow (Pillow decode + resize)",
    "region4": "region4 (old name of fast)",
    "region3": "region3 (old name of fast-bilinear)",
}
_REVISION_OF = {"fast": "region4", "fast-bilinear": "region3", "pillow": "pillow"}
# Each revision of the region decoder (issue 27 measured them on the real-photo set, docs/bench/transform.json):
# "region" reduced by DCT scaling as far as the output allowed: 1/8 aliases, up to 2.6 dB below Pillow.
# "region2" keeps the decoded crop >= 2x the output, narrows the bilinear filter to 0.8 of the factor when it
# reduced (the DCT scaling already low-passed), and upsamples chroma as a box (sharper after the downscale).
# "region3" is region2 that, for a progressive file decoded at a reduced DCT scale, stops before the scans refining
# the AC coefficients' last bit: 38 % less decoding of such files, 0.016 dB mean PSNR, no image below Pillow's.
# "region4" is region3 resampling a full-scale decode (ImageNet-size sources) with Pillow's BICUBIC kernel instead of
# the bilinear (triangle) one: about 2 dB closer to the full-precision reference (1.8 dB on real photos), above
# OpenCV's INTER_AREA, for about 4 % of the time; reduced decodes (2 MP and more) stay region3's (issue 44).
REGION_SETTINGS = {
    "region": fastjpeg.FIRST,
    "region2": fastjpeg.RegionSettings(min_ratio=2.0, narrow_when_reduced=0.8, fancy_upsampling=False),
    "region3": fastjpeg.RegionSettings(
        min_ratio=2.0, narrow_when_reduced=0.8, fancy_upsampling=False, last_ac_bits_when_reduced=False
    ),
    "region4": fastjpeg.RegionSettings(
        min_ratio=2.0,
        narrow_when_reduced=0.8,
        fancy_upsampling=False,
        last_ac_bits_when_reduced=False,
        kernel="bicubic",
    ),
}
ONE_CALL_DECODERS = ("region2", "region3", "region4")  # whose JPEGs take fastjpeg.transform (the Pillow-free path)


def resolve_decoder(name: str) -> Decoder:
    """The revision NAME stands for: "auto" is the default of this installation (fastjpeg.default_decoder), "fast" the
    latest region revision, "fast-bilinear" region3; revision names and "pillow" stand for themselves. Unknown names
    raise ConfigError listing the choices."""
    from imgest.core.errors import ConfigError

    if name == "auto":
        return fastjpeg.default_decoder()
    if name in _REVISION_OF:
        return _REVISION_OF[name]  # type: ignore[return-value]
    if name in REGION_DECODERS:
        return name  # type: ignore[return-value]
    choices = ", ".join([*DECODER_CHOICES, *DECODER_ALIASES])
    raise ConfigError(f"JPEG decoder {name!r} is not one of {choices}")


def decoder_help() -> str:
    """What each choice does, for --help and the trigger form."""
    names = "; ".join(f"{k}: {v}" for k, v in DECODER_CHOICES.items())
    return f"{names}. region4 / region3 / region2 / region name the revisions themselves (a version records one)."
