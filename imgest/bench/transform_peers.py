"""The peers of `imgest bench transform --peers`: what practitioners use to preprocess ImageNet fast (issue 44).

Every peer makes the transform's output (shorter side to 256, centre crop 224, JPEG of the transform's quality,
upright by EXIF orientation) from a scaled decode:
- ``pillow-draft``: Pillow's DCT scaling (``Image.draft``) + bilinear resize + crop + encode
  (imgest.bench.peer_pillow);
- ``opencv-reduced``: OpenCV's ``IMREAD_REDUCED_COLOR_2/4/8`` (the largest that keeps the shorter side at least 256)
  + ``INTER_AREA`` resize + crop + ``imencode``;
- ``simplejpeg``: libjpeg-turbo's scaled decode (``min_width`` / ``min_height``) + Pillow resize + crop + encode;
- ``pillow-simd``: pillow-draft run by pillow-simd in its own environment (it replaces Pillow; built by
  scripts/build_pillow_simd.sh), a subprocess timing the same files.
A file a peer's decoder refuses (simplejpeg: CMYK) goes through pillow-draft instead, as a practitioner's fallback
would, and is counted. Groups (:func:`groups_of`) come from the file's own header: its frame type (SOF0/1 baseline,
SOF2 progressive, SOF9+ arithmetic), its components (1 grey, 4 CMYK) and its pixel count.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imgest.bench import peer_pillow
from imgest.core.paths import state_dir
from imgest.transform.image import TransformSpec

SIMD_VENV = "bench/pillow-simd-venv"  # under the state folder (.imgest/): scripts/build_pillow_simd.sh builds it
IMAGENET_PIXELS = (100_000, 500_000)
LARGE_PIXELS = 2_000_000
SOF_CODING = {0xC0: "baseline", 0xC1: "baseline", 0xC2: "progressive", 0xC3: "lossless"}
SOF_CODING |= {m: "arithmetic" for m in (0xC9, 0xCA, 0xCB)} | {m: "hierarchical" for m in (0xC5, 0xC6, 0xC7)}


@dataclass(frozen=True)
class JpegKind:
    """What a JPEG's frame header says: coding (baseline, progressive, arithmetic, ...), components, size."""

    coding: str
    components: int
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


def jpeg_kind(data: bytes) -> JpegKind | None:
    """The frame header of DATA's first frame (markers walked up to the first SOFn); None: not a readable JPEG."""
    if data[:2] != b"\xff\xd8":
        return None
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        if marker in SOF_CODING or marker in (0xCD, 0xCE, 0xCF):
            seg = data[pos + 4 : pos + 2 + length]
            if len(seg) < 6:
                return None
            coding = SOF_CODING.get(marker, "arithmetic")
            return JpegKind(coding, seg[5], int.from_bytes(seg[3:5], "big"), int.from_bytes(seg[1:3], "big"))
        if marker == 0xDA:
            return None
        pos += 2 + length
    return None


def groups_of(kind: JpegKind | None) -> list[str]:
    """The peer groups a file belongs to: ImageNet-size (0.1-0.5 MP) files by colour and coding ("baseline" and
    "progressive" are colour files; "grey" and "CMYK" any coding; "arithmetic"), and every file of >= 2 MP."""
    if kind is None:
        return []
    groups = []
    if IMAGENET_PIXELS[0] <= kind.pixels < IMAGENET_PIXELS[1]:
        if kind.components == 1:
            groups.append("grey")
        elif kind.components == 4:
            groups.append("CMYK")
        elif kind.coding in ("baseline", "progressive", "arithmetic"):
            groups.append(kind.coding)
    if kind.pixels >= LARGE_PIXELS:
        groups.append(">= 2 MP")
    return groups


def _upright_size(data: bytes, width: int, height: int) -> tuple[int, int, Any]:
    """(upright width, upright height, the Pillow transpose that makes the pixels upright or None)."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        fix = peer_pillow.UPRIGHT.get(img.getexif().get(peer_pillow.EXIF_ORIENTATION, 1))
    if fix in peer_pillow.TURNED:
        return height, width, fix
    return width, height, fix


def _reduction(shorter: int, resize: int) -> int:
    """The largest of 8, 4, 2 (else 1) that keeps SHORTER at least RESIZE."""
    return next((k for k in (8, 4, 2) if shorter // k >= resize), 1)


def opencv_reduced(data: bytes, spec: TransformSpec) -> bytes:
    """OpenCV: reduced decode (EXIF orientation applied by imdecode), INTER_AREA resize, crop, imencode."""
    import cv2
    import numpy as np

    kind = jpeg_kind(data)
    flags = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4}
    flags[8] = cv2.IMREAD_REDUCED_COLOR_8
    k = _reduction(min(kind.width, kind.height), spec.resize) if kind else 1
    img = cv2.imdecode(np.frombuffer(data, np.uint8), flags[k])
    if img is None:
        raise ValueError("OpenCV could not decode the file")
    h, w = img.shape[:2]  # upright, reduced: the full picture's aspect
    if kind is not None and (w > h) != (kind.width > kind.height):
        full_w, full_h = kind.height, kind.width
    else:
        full_w, full_h = (kind.width, kind.height) if kind else (w, h)
    size, (left, top, right, bottom) = peer_pillow.output_box(full_w, full_h, spec.resize, spec.crop)
    img = cv2.resize(img, size, interpolation=cv2.INTER_AREA)[top:bottom, left:right]
    ok, out = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, spec.quality])
    if not ok:
        raise ValueError("OpenCV could not encode")
    return out.tobytes()


def simplejpeg_scaled(data: bytes, spec: TransformSpec) -> bytes:
    """simplejpeg (libjpeg-turbo): decode scaled to at least the resize, Pillow resize + crop + encode."""
    import simplejpeg
    from PIL import Image

    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    scale = spec.resize / min(width, height)
    pixels = simplejpeg.decode_jpeg(
        data, colorspace="RGB", min_width=int(width * scale + 0.999), min_height=int(height * scale + 0.999)
    )
    upright_w, upright_h, fix = _upright_size(data, width, height)
    img = Image.fromarray(pixels)
    if fix is not None:
        img = img.transpose(fix)
    return peer_pillow.finish(img, upright_w, upright_h, spec.resize, spec.crop, spec.quality)


def pillow_draft(data: bytes, spec: TransformSpec) -> bytes:
    return peer_pillow.draft_transform(data, spec.resize, spec.crop, spec.quality)


PEERS: dict[str, Callable[[bytes, TransformSpec], bytes]] = {
    "pillow-draft": pillow_draft,
    "opencv-reduced": opencv_reduced,
    "simplejpeg": simplejpeg_scaled,
}
MODULES = {"pillow-draft": "PIL", "opencv-reduced": "cv2", "simplejpeg": "simplejpeg"}


def with_fallback(name: str, spec: TransformSpec) -> Callable[[bytes], bytes]:
    """Peer NAME on one file, pillow-draft where its decoder refuses the file (the timed form)."""
    peer = PEERS[name]

    def run(data: bytes) -> bytes:
        try:
            return peer(data, spec)
        except Exception:  # the peer's decoder refuses the file: a practitioner falls back to Pillow
            return pillow_draft(data, spec)

    return run


def installed_peers() -> dict[str, str]:
    """In-process peer -> its version (Pillow also with its libjpeg-turbo), for those whose package is installed."""
    import importlib

    found = {}
    for name, module in MODULES.items():
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        found[name] = str(getattr(mod, "__version__", "?"))
    if "pillow-draft" in found:
        from PIL import features

        found["pillow-draft"] += f" (libjpeg-turbo {features.version('libjpeg_turbo')})"
    if "opencv-reduced" in found:
        import cv2

        cv2.setNumThreads(1)  # one core, as every pipeline here
    return found


def simd_python() -> Path:
    """The pillow-simd environment's Python (it may not exist: scripts/build_pillow_simd.sh builds it)."""
    return state_dir() / SIMD_VENV / "bin" / "python"


class SimdPeer:
    """pillow-simd's pillow-draft on a batch, in its own environment: the batch is written to files once; each
    :meth:`timed` pass is a subprocess that times one pass itself (process CPU and wall, after a warm-up)."""

    def __init__(self, python: Path, spec: TransformSpec) -> None:
        self.python, self.spec = python, spec
        self._tmp = tempfile.TemporaryDirectory(prefix="imgest-simd-")
        self._files: list[str] = []
        self.version = self._call([])["pillow"] if python.exists() else None

    def _call(self, extra: list[str], files: list[str] | None = None) -> dict[str, Any]:
        args = ["--resize", str(self.spec.resize), "--crop", str(self.spec.crop), "--quality", str(self.spec.quality)]
        files = files if files is not None else self._files
        if not files:  # version probe: one tiny image
            probe = Path(self._tmp.name) / "probe.jpg"
            from PIL import Image

            Image.new("RGB", (300, 300)).save(probe, "JPEG")
            files = [str(probe)]
        done = subprocess.run(
            [str(self.python), peer_pillow.__file__, *args, *extra, *files], capture_output=True, text=True, check=True
        )
        return json.loads(done.stdout.strip().splitlines()[-1])

    def load(self, batch: list[bytes]) -> None:
        folder = Path(self._tmp.name) / "batch"
        folder.mkdir(exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        self._files = []
        for i, data in enumerate(batch):
            (folder / f"{i:05d}.jpg").write_bytes(data)
            self._files.append(str(folder / f"{i:05d}.jpg"))

    def timed(self) -> tuple[float, float]:
        """(process CPU seconds, wall seconds) of one pass over the loaded batch."""
        record = self._call([])
        return float(record["cpu_s"]), float(record["wall_s"])

    def outputs(self) -> list[bytes]:
        """The outputs for the loaded batch (the quality pass)."""
        out = Path(self._tmp.name) / "out"
        self._call(["--out", str(out)])
        return [(out / f"{i}.jpg").read_bytes() for i in range(len(self._files))]

    def close(self) -> None:
        self._tmp.cleanup()
