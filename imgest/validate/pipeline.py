"""The one DALI pipeline every engine feeds: DALI's own file reader (the reference) or ``fn.external_source``.

The graph after the reader is the same for all: the encoded bytes and the label come out (the check hashes the
bytes DALI hands over), and with ``decode`` the images are also decoded and resized on the CPU. Where DALI is not
installed, the engines feed a host pipeline instead (imgest.readback.pipelines.HostPipeline: the bytes as read,
no decode) and DALI's file reader is skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from imgest.validate.dataset import Sample

Reader = Callable[[Sequence[Sample]], list[bytes]]


def _tail(jpegs: Any, labels: Any, decode: bool) -> tuple[Any, ...]:
    import nvidia.dali.fn as fn

    if not decode:
        return jpegs, labels
    images = fn.resize(fn.decoders.image(jpegs, device="cpu"), resize_shorter=256)
    return jpegs, labels, images


def reference_pipeline(split_dir: Path, batch_size: int, num_threads: int, decode: bool) -> Any:
    """``fn.readers.file`` over SPLIT_DIR (labels = sorted class folders), built."""
    import nvidia.dali.fn as fn
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=None)
    def graph() -> tuple[Any, ...]:
        jpegs, labels = fn.readers.file(file_root=str(split_dir), name="Reader", pad_last_batch=True)
        return _tail(jpegs, labels, decode)

    pipe = graph()
    pipe.build()
    return pipe


def external_pipeline(
    read: Reader, batches: Callable[[], Iterator[Sequence[Sample]]], batch_size: int, num_threads: int, decode: bool
) -> Any:
    """``fn.external_source`` fed by READ over the sample batches BATCHES() yields (labels from the samples), built;
    where DALI cannot be imported, a HostPipeline handing each batch over as read (no decode)."""
    from imgest.readback.pipelines import dali_missing, host_pipeline

    def source() -> Iterator[tuple[list[np.ndarray], list[np.ndarray]]]:
        for part in batches():
            data = read(part)
            yield (
                [np.frombuffer(d, dtype=np.uint8) for d in data],
                [np.array([s.label], dtype=np.int32) for s in part],
            )

    reason = dali_missing()
    if reason is not None:
        return host_pipeline("decode" if decode else "raw", source().__next__, reason)
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=None)
    def graph() -> tuple[Any, ...]:
        jpegs, labels = fn.external_source(
            source=source(), num_outputs=2, batch=True, dtype=[types.UINT8, types.INT32], no_copy=False
        )
        return _tail(jpegs, labels, decode)

    pipe = graph()
    pipe.build()
    return pipe


def run_batches(pipe: Any, iterations: int | None) -> Iterator[tuple[float, Any]]:
    """(seconds spent in pipe.run(), outputs) per batch: ITERATIONS of them, or until the source ends."""
    done = 0
    while iterations is None or done < iterations:
        start = time.perf_counter()
        try:
            outputs = pipe.run()
        except StopIteration:
            return
        yield time.perf_counter() - start, outputs
        done += 1


def samples_of(outputs: Any) -> Iterator[tuple[bytes, int, str]]:
    """(encoded bytes, label, source info) of every sample of one batch of outputs."""
    jpegs, labels = outputs[0], outputs[1]
    for k in range(len(jpegs)):
        tensor = jpegs[k]
        yield np.array(tensor).tobytes(), int(np.array(labels[k]).reshape(-1)[0]), tensor.source_info()
