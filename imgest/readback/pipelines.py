"""The DALI pipelines every reader feeds: raw bytes to host memory, or a training pipeline.

The reader never decides the training pipeline: the same graph (decode, random resized crop 224, flip,
normalize) sits behind ``fn.readers.file``, ``fn.readers.webdataset`` and ``fn.external_source`` alike, on CPU
or with the ``mixed`` decoder on a GPU. Every pipeline also returns the encoded bytes, so each run can hash
what it read.

DALI is an optional extra (``imgest[dali]``): :func:`dali_missing` says whether it can be imported here. Without
it, ``external_pipeline`` in raw mode is a :class:`HostPipeline` (each batch handed over as it came, in host
memory), so the readers that only feed ``fn.external_source`` still run and are verified the same way.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from imgest.core.errors import ImgestError

MODES = ("raw", "train")
IMAGE_EXTS = "jpg;jpeg;png;bmp;tif;tiff;webp;gif"
MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]
READER = "Reader"
DALI_EXTRA = "pip install 'imgest[dali]'"


@dataclass(frozen=True)
class PipelineSpec:
    """What every pipeline shares: batch size, threads, mode, device (None: CPU only) and crop size."""

    batch_size: int = 64
    num_threads: int = 2
    mode: str = "raw"
    device_id: int | None = None
    crop: int = 224
    prefetch_queue_depth: int = 2
    seed: int = 0
    checkpointing: bool = False  # DALI's enable_checkpointing: pipe.checkpoint() saves the readers' positions
    verify_after: bool = False  # keep each sample's bytes and verify after the epoch (benchmarks: time only run())


NVIDIA_SIGNS = ("/dev/nvidia0", "/dev/nvidiactl", "/proc/driver/nvidia/version")


def nvidia_present() -> list[str]:
    """What says this machine has an NVIDIA GPU and driver (device nodes, the driver's /proc entry); [] for none."""
    return [sign for sign in NVIDIA_SIGNS if Path(sign).exists()]


def cuda_devices() -> int:
    """How many CUDA devices DALI sees: 0 on a machine without an NVIDIA GPU. A machine that has one (its device
    nodes or driver are there) where DALI's probe fails has a broken install: GpuProbeError says so, so GPU checks
    fail instead of being skipped as if there were no GPU."""
    from nvidia.dali.backend import GetCUDADeviceCount

    try:
        return int(GetCUDADeviceCount())
    except Exception as exc:
        signs = nvidia_present()
        if not signs:  # no driver, no device: no GPU
            return 0
        raise GpuProbeError(
            f"this machine has an NVIDIA GPU ({', '.join(signs)}) but DALI cannot use it: {type(exc).__name__}: "
            f"{exc}; check the driver against DALI's CUDA (nvidia-dali-cuda130 needs a CUDA 13 driver) and "
            "LD_LIBRARY_PATH"
        ) from exc


class GpuProbeError(ImgestError):
    """An NVIDIA GPU is there and DALI cannot use it (a broken driver, CUDA runtime or DALI install)."""


class DaliMissingError(ImgestError):
    """What was asked needs DALI, and DALI cannot be imported here."""


def dali_missing() -> str | None:
    """Why DALI is not here ("not installed"), or None when it can be used: the one probe every reader and check
    asks. An installed DALI whose import fails (a broken install, a missing CUDA library) raises DaliMissingError: a
    deployment that installed imgest[dali] must not lose its DALI readers to a warning."""
    try:
        if importlib.util.find_spec("nvidia.dali") is None:
            return f"DALI is not installed ({DALI_EXTRA})"
        import nvidia.dali  # noqa: F401
    except ImportError as exc:  # no nvidia namespace at all, or DALI's own import failed
        if isinstance(exc, ModuleNotFoundError) and exc.name in ("nvidia", "nvidia.dali"):
            return f"DALI is not installed ({DALI_EXTRA})"
        raise DaliMissingError(
            f"DALI is installed but cannot be imported ({type(exc).__name__}: {exc}); reinstall it: {DALI_EXTRA}"
        ) from exc
    return None


def dali_available() -> bool:
    """Whether DALI can be imported here (imgest[dali] installed and working)."""
    return dali_missing() is None


class HostTensor:
    """One sample of a HostPipeline output: its array (``numpy.asarray``) and an empty ``source_info()``."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        return np.asarray(self.data, dtype)

    def source_info(self) -> str:
        return ""


class HostOutput:
    """One output of a HostPipeline batch, with what the readers use of DALI's TensorListCPU: ``len``, ``at(i)``
    (an array) and ``[i]`` (a tensor)."""

    def __init__(self, items: Sequence[Any]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def at(self, i: int) -> np.ndarray:
        return np.asarray(self.items[i])

    def __getitem__(self, i: int) -> HostTensor:
        return HostTensor(self.items[i])


class HostPipeline:
    """``fn.external_source`` in raw mode without DALI: each ``run()`` returns SOURCE's next batch (encoded images,
    labels) as it came, in host memory, and raises StopIteration where the source ends, as DALI's does."""

    device_id = None

    def __init__(self, source: Callable[[], tuple[Sequence[Any], Any]]) -> None:
        self.source = source

    def run(self) -> tuple[HostOutput, HostOutput]:
        images, labels = self.source()
        return HostOutput(list(images)), HostOutput(labels)


def host_pipeline(mode: str, source: Callable[[], tuple[Sequence[Any], Any]], reason: str) -> HostPipeline:
    """A HostPipeline over SOURCE in MODE raw; any other MODE (decoding) needs DALI, missing for REASON."""
    if mode != "raw":
        raise DaliMissingError(f"the {mode} pipeline decodes images in DALI: {reason}")
    return HostPipeline(source)


def _train(jpegs: Any, spec: PipelineSpec) -> Any:
    from nvidia.dali import fn, types

    decoder = "mixed" if spec.device_id is not None else "cpu"
    images = fn.decoders.image_random_crop(jpegs, device=decoder, output_type=types.RGB, seed=spec.seed)
    images = fn.resize(images, resize_x=spec.crop, resize_y=spec.crop)
    return fn.crop_mirror_normalize(
        images,
        dtype=types.FLOAT,
        output_layout="CHW",
        mean=MEAN,
        std=STD,
        mirror=fn.random.coin_flip(seed=spec.seed),
    )


def build_pipeline(spec: PipelineSpec, graph: Callable[[], tuple[Any, ...]], checkpoint: str | None = None) -> Any:
    """A built DALI pipeline of SPEC around GRAPH (a reader returning encoded images, labels and any extra outputs):
    raw bytes, or the training graph with the bytes beside it; CHECKPOINT restores a saved position."""
    from nvidia.dali import Pipeline

    saving: dict[str, Any] = {"enable_checkpointing": True} if spec.checkpointing or checkpoint else {}
    if checkpoint:
        saving["checkpoint"] = checkpoint
    pipe = Pipeline(
        batch_size=spec.batch_size,
        num_threads=spec.num_threads,
        device_id=spec.device_id,
        prefetch_queue_depth=spec.prefetch_queue_depth,
        seed=spec.seed,
        **saving,
    )
    with pipe:
        jpegs, labels, *extra = graph()
        outputs = (jpegs, labels, *extra) if spec.mode == "raw" else (_train(jpegs, spec), labels, jpegs, *extra)
        pipe.set_outputs(*outputs)
    pipe.build()
    return pipe


def file_pipeline(
    spec: PipelineSpec, files: Sequence[str], labels: Sequence[int], checkpoint: str | None = None, **reader: Any
) -> Any:
    """fn.readers.file over FILES (absolute paths, in this order) with their LABELS; CHECKPOINT (from
    ``pipe.checkpoint()`` of the same pipeline) restores its position; READER adds reader arguments (shard_id,
    num_shards, random_shuffle, seed, ...)."""
    from nvidia.dali import fn

    def graph() -> tuple[Any, ...]:
        args = {"random_shuffle": False, "pad_last_batch": True, **reader}
        return fn.readers.file(files=list(files), labels=[int(x) for x in labels], name=READER, **args)

    return build_pipeline(spec, graph, checkpoint)


def webdataset_pipeline(
    spec: PipelineSpec,
    paths: Sequence[str],
    index_paths: Sequence[str] | None,
    checkpoint: str | None = None,
    **reader: Any,
) -> Any:
    """fn.readers.webdataset over shard PATHS (folders or s3:// URLs) with their DALI indexes; CHECKPOINT and
    READER as for file_pipeline."""
    from nvidia.dali import fn

    def graph() -> tuple[Any, ...]:
        jpegs, cls, meta = fn.readers.webdataset(
            paths=list(paths),
            index_paths=list(index_paths) if index_paths else None,
            ext=[IMAGE_EXTS, "cls", "json"],
            missing_component_behavior="error",
            name=READER,
            **{"pad_last_batch": True, **reader},
        )
        return jpegs, cls, meta

    return build_pipeline(spec, graph, checkpoint)


def external_pipeline(spec: PipelineSpec, source: Callable[[], tuple[list[Any], Any]]) -> Any:
    """fn.external_source(batch=True) fed by SOURCE, a callable returning (encoded images, labels); without DALI
    a HostPipeline over SOURCE (raw mode only)."""
    reason = dali_missing()
    if reason is not None:
        return host_pipeline(spec.mode, source, reason)
    from nvidia.dali import fn, types

    def graph() -> tuple[Any, ...]:
        return tuple(fn.external_source(source=source, num_outputs=2, batch=True, dtype=[types.UINT8, types.INT32]))

    return build_pipeline(spec, graph)
