"""Read engines that feed ``fn.external_source``: the Python file API, xNVMe's file API, xNVMe's block API.

Each engine turns a batch of samples into their bytes, in order, and says what it ran on (backend, queue depth).
The block engine reads by LBA from the block device under the dataset, using the FIEMAP block map; a file whose
extents cannot be read verbatim falls back to the Python file API, with the reason counted.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imgest.validate.blockmap import BlockMap
from imgest.validate.dataset import Sample
from imgest.validate.fiemap import device_ranges
from imgest.validate.xnvme_lib import Buffer, Handle, Queue, XnvmeIOError, load, open_dev, open_preferring

log = logging.getLogger(__name__)

ASYNC_PREFERENCE = ("io_uring", "libaio")


class PythonFileEngine:
    """``open`` / ``seek`` / ``read``: the baseline."""

    name = "python_file"

    def __init__(self, root: Path) -> None:
        self.root = root

    def info(self) -> dict[str, Any]:
        """What this engine ran on."""
        return {"backend": "python open/read", "queue_depth": 1}

    def read_batch(self, samples: Sequence[Sample]) -> list[bytes]:
        """The bytes of SAMPLES, in order."""
        out = []
        for s in samples:
            with open(self.root / s.path, "rb") as fh:
                fh.seek(s.offset)
                out.append(fh.read(s.size))
        return out

    def close(self) -> None:
        """Nothing to release."""


class XnvmeFileEngine:
    """``xnvme_file_open`` + ``xnvme_file_pread`` per file; with QUEUE_DEPTH > 1 each file is read in CHUNK-byte
    pieces, QUEUE_DEPTH of them in flight on an async queue (io_uring where available)."""

    name = "xnvme_file"

    def __init__(self, root: Path, queue_depth: int, chunk: int) -> None:
        self.root, self.depth, self.chunk = root, queue_depth, chunk
        self.api = load()
        self.buf = Buffer(self.api)
        self.async_name: str | None = None
        self.backend: dict[str, str] = {}

    def info(self) -> dict[str, Any]:
        """What this engine ran on: the mixins xNVMe chose and the queue depth."""
        return {"backend": _backend_text(self.backend), "queue_depth": self.depth, "chunk_bytes": self.chunk}

    def _open(self, path: str) -> Handle:
        if self.async_name is not None:
            return open_dev(self.api, path, self.async_name or None)
        handle = open_preferring(self.api, path, ASYNC_PREFERENCE if self.depth > 1 else ())
        self.backend = handle.backend
        self.async_name = handle.backend["async"] if self.depth > 1 else ""
        log.info("xNVMe file API: backend %s, queue depth %d", _backend_text(self.backend), self.depth)
        return handle

    def read_batch(self, samples: Sequence[Sample]) -> list[bytes]:
        """The bytes of SAMPLES, in order."""
        return [self._read(s) for s in samples]

    def _read(self, s: Sample) -> bytes:
        api = self.api
        handle = self._open(str(self.root / s.path))
        try:
            ptr = self.buf.ensure(s.size)
            if self.depth <= 1:
                ctx = api.xnvme_file_get_cmd_ctx(handle.dev)
                err = api.xnvme_file_pread(ctx, ptr, s.size, s.offset)
                if err:
                    raise XnvmeIOError(f"xnvme_file_pread({s.path}) failed ({err})")
                return self.buf.bytes_at(0, s.size)
            queue = Queue(handle, self.depth)
            try:
                for pos in range(0, s.size, self.chunk):
                    n = min(self.chunk, s.size - pos)
                    queue.submit(pos, api.xnvme_file_pread, ptr + pos, n, s.offset + pos)
                if queue.drain():
                    raise XnvmeIOError(f"xNVMe read of {s.path} failed")
            finally:
                queue.close()
            return self.buf.bytes_at(0, s.size)
        finally:
            handle.close()

    def close(self) -> None:
        """Free the buffer."""
        self.buf.free()


@dataclass
class Plan:
    """How one sample is read by LBA: (buffer offset, slba, nlb) reads; (buffer offset, length) of its bytes."""

    reads: list[tuple[int, int, int]]
    segments: list[tuple[int, int]]


class XnvmeBlockEngine:
    """Reads by LBA from the block device under the dataset (one async queue of QUEUE_DEPTH for a whole batch)."""

    name = "xnvme_block"

    def __init__(self, root: Path, block_map: BlockMap, queue_depth: int, direct: bool = True) -> None:
        self.root, self.map, self.depth = root, block_map, queue_depth
        self.api = load()
        self.handle = open_preferring(self.api, str(block_map.device), ASYNC_PREFERENCE, direct=direct)
        self.lba = self.handle.lba_nbytes or 512
        self.nsid = self.api.xnvme_dev_get_nsid(self.handle.dev)
        self.max_io = 128 * 1024
        self.queue = Queue(self.handle, queue_depth)
        self.buf = Buffer(self.api)
        self.fallbacks: Counter[str] = Counter()
        self.python = PythonFileEngine(root)
        log.info(
            "xNVMe block API on %s: backend %s, queue depth %d, LBA %d bytes, direct %s",
            block_map.device,
            _backend_text(self.handle.backend),
            queue_depth,
            self.lba,
            direct,
        )

    def info(self) -> dict[str, Any]:
        """What this engine ran on, and how many files fell back to the file API (by reason)."""
        return {
            "backend": _backend_text(self.handle.backend),
            "queue_depth": self.depth,
            "device": str(self.map.device),
            "lba_bytes": self.lba,
            "fallbacks": dict(self.fallbacks),
        }

    def _plan(self, samples: Sequence[Sample]) -> tuple[list[Plan | None], int]:
        """Per sample its LBA reads and where its bytes land in the buffer (None: fall back); the buffer size."""
        plans: list[Plan | None] = []
        pos = 0
        for s in samples:
            i = self.map.find(s.path)
            _, extents, fallback = self.map.entry(i) if i >= 0 else (0, [], "unmapped")
            if fallback:
                self.fallbacks[fallback] += 1
                plans.append(None)
                continue
            plan = Plan([], [])
            for phys, length in device_ranges(extents, s.offset, s.size):
                first, skip = divmod(phys, self.lba)
                total = -(-(skip + length) // self.lba) * self.lba
                for part in range(0, total, self.max_io):
                    n = min(self.max_io, total - part)
                    plan.reads.append((pos + part, first + part // self.lba, n // self.lba))
                plan.segments.append((pos + skip, length))
                pos += total
            plans.append(plan)
        return plans, pos

    def read_batch(self, samples: Sequence[Sample]) -> list[bytes]:
        """The bytes of SAMPLES, in order (fallback files through the Python file API)."""
        plans, nbytes = self._plan(samples)
        ptr = self.buf.ensure(max(nbytes, self.lba))
        for i, plan in enumerate(plans):
            for boff, slba, nlb in plan.reads if plan else ():
                self.queue.submit(i, self.api.xnvme_nvm_read, self.nsid, slba, nlb - 1, ptr + boff, None)
        failed = self.queue.drain()
        if failed:
            paths = ", ".join(samples[i].path for i in sorted(set(failed))[:5])
            raise XnvmeIOError(f"LBA reads from {self.map.device} failed for {paths}")
        return [
            b"".join(self.buf.bytes_at(off, n) for off, n in plan.segments) if plan else self.python.read_batch([s])[0]
            for s, plan in zip(samples, plans, strict=True)
        ]

    def close(self) -> None:
        """Close the queue, the device and the buffer."""
        self.queue.close()
        self.buf.free()
        self.handle.close()


def _backend_text(backend: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in backend.items() if v) or "unknown"
