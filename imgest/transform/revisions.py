"""The revisions of the region decoder: what each decides (its output bytes follow from these). A dataset version
records the revision that wrote it, so every revision stays, byte for byte."""

from __future__ import annotations

from typing import Literal

from imgest.transform import fastjpeg

Decoder = Literal["region", "region2", "region3", "region4", "pillow"]
REGION_DECODERS = ("region", "region2", "region3", "region4")
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
