"""The transform's settings (TransformSpec), recorded with every dataset version: importable without numpy or
Pillow, so that validating a request (a DAG file parsing its datasets file, the trigger form) loads neither.
imgest.transform.image applies them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from imgest.core import defaults
from imgest.core.errors import ConfigError
from imgest.transform import fastjpeg
from imgest.transform.revisions import REGION_DECODERS, Decoder, resolve_decoder

Mode = Literal["jpeg", "unchanged"]
Check = Literal["decode", "header"]


@dataclass(frozen=True)
class TransformSpec:
    """Transform settings; recorded with every dataset version."""

    mode: Mode = defaults.IMAGE_MODE
    resize: int = defaults.RESIZE
    crop: int = defaults.CROP
    quality: int = defaults.QUALITY
    max_pixels: int = defaults.MAX_PIXELS
    dct_scaling: bool = True
    # UNCHANGED mode only: "decode" decodes every file (JPEG: all entropy-coded data is read);
    # "header" parses the header and checks the end marker (JPEG EOI, PNG IEND) without decoding pixels.
    unchanged_check: Check = defaults.UNCHANGED_CHECK  # type: ignore[assignment]
    # Which code decodes JPEG sources: "region4" (imgest's compiled libjpeg-turbo region decode, the default where
    # it is built), "region3" (the same with the bilinear kernel), "region2" / "region" (earlier revisions, for
    # versions they wrote) or "pillow". Recorded because each produces different output bytes.
    jpeg_decoder: Decoder = field(default_factory=fastjpeg.default_decoder)

    def __post_init__(self) -> None:
        if self.mode not in ("jpeg", "unchanged"):
            raise ConfigError(f"image mode {self.mode!r} is not one of 'jpeg', 'unchanged'")
        if self.unchanged_check not in ("decode", "header"):
            raise ConfigError(f"unchanged check {self.unchanged_check!r} is not one of 'decode', 'header'")
        if not 1 <= self.crop <= self.resize:
            raise ConfigError(f"crop {self.crop} must be between 1 and resize {self.resize}")
        if not 1 <= self.quality <= 100:
            raise ConfigError(f"JPEG quality {self.quality} must be between 1 and 100")
        if self.max_pixels < 1:
            raise ConfigError(f"max_pixels {self.max_pixels} must be positive")
        object.__setattr__(self, "jpeg_decoder", resolve_decoder(self.jpeg_decoder))  # "fast" -> the revision
        if self.jpeg_decoder in REGION_DECODERS and not fastjpeg.available():
            raise ConfigError(
                f"the JPEG decoder {self.jpeg_decoder!r} is not built in this installation: {fastjpeg.BUILD_HINT}"
            )

    @classmethod
    def from_args(cls, args: Any) -> TransformSpec:
        """The spec of a job's or command's TRANSFORM_OPTIONS (imgest.spark.job_options); no --jpeg-decoder: the
        default."""
        decoder = getattr(args, "jpeg_decoder", None)
        return cls(
            args.mode,
            args.resize,
            args.crop,
            args.quality,
            args.max_pixels,
            unchanged_check=args.unchanged_check,
            **({"jpeg_decoder": decoder} if decoder else {}),
        )

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> TransformSpec:
        """The spec a dataset version recorded (records from before jpeg_decoder existed used Pillow)."""
        return cls(**{"jpeg_decoder": "pillow", **record})

    def as_dict(self) -> dict[str, object]:
        return asdict(self)
