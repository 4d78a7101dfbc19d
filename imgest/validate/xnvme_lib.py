"""libxnvme through the PyPI bindings (``xnvme.ctypes_bindings``): finding the library, opening files and devices.

The bindings load the library once, at import, from ``XNVME_LIBRARY_PATH`` or the system's search path. When
the variable is unset, the build that ``scripts/install.sh`` left in the state folder is used.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from imgest.core.errors import ImgestError
from imgest.core.paths import state_dir

log = logging.getLogger(__name__)

MIXINS = ("be", "mem", "sync", "async", "admin")


class XnvmeUnavailableError(ImgestError):
    """libxnvme cannot be loaded; the message says why and how to get it."""


class XnvmeIOError(ImgestError):
    """An xNVMe call failed; the message names the file or device."""


def built_library() -> Path | None:
    """The libxnvme.so that scripts/install.sh built into the state folder, if any."""
    found = sorted((state_dir() / "xnvme" / "install").glob("lib*/**/libxnvme.so"))
    return found[0] if found else None


def load() -> ModuleType:
    """The loaded bindings module, or XnvmeUnavailableError saying why."""
    if not os.environ.get("XNVME_LIBRARY_PATH"):
        built = built_library()
        if built is not None:
            os.environ["XNVME_LIBRARY_PATH"] = str(built)
    try:
        from xnvme.ctypes_bindings import api
    except ImportError as exc:
        raise XnvmeUnavailableError(f"the xnvme Python bindings are not installed ({exc}); reinstall imgest") from None
    if not api.is_loaded:
        where = os.environ.get("XNVME_LIBRARY_PATH") or "the system library path"
        raise XnvmeUnavailableError(
            f"libxnvme not found ({where}): run 'make install' (builds it from ../shared/vendor or $IMGEST_XNVME_SRC), "
            "install it from your distribution or conda-forge, or set XNVME_LIBRARY_PATH to a libxnvme.so"
        )
    return api


def _cstr(value: str) -> Any:
    buf = ctypes.create_string_buffer(value.encode())
    return ctypes.cast(buf, ctypes.POINTER(ctypes.c_char)), buf


@dataclass
class Handle:
    """An open xNVMe device or file, with the mixins xNVMe chose for it."""

    api: ModuleType
    dev: Any
    path: str
    backend: dict[str, str]
    lba_nbytes: int
    tbytes: int

    def close(self) -> None:
        """Close the device or file."""
        if self.dev:
            self.api.xnvme_dev_close(self.dev)
            self.dev = None


def open_dev(api: ModuleType, path: str, async_name: str | None = None, direct: bool = False) -> Handle:
    """Open PATH (a file or a block device) read-only; ASYNC_NAME asks for an async mixin (e.g. io_uring)."""
    opts = api.xnvme_opts_default()
    opts.rdonly = 1
    opts.direct = int(direct)
    keep = []
    if async_name:
        ptr, buf = _cstr(async_name)
        setattr(opts, "async", ptr)
        keep.append(buf)
    dev = api.xnvme_dev_open(path.encode(), ctypes.byref(opts))
    if not dev:
        err = ctypes.get_errno() or 0
        raise XnvmeIOError(
            f"xnvme_dev_open({path}, async={async_name}) failed{f' ({os.strerror(err)})' if err else ''}"
        )
    chosen = api.xnvme_dev_get_opts(dev).contents
    backend = {name: api.string_cast(getattr(chosen, name)) or "" for name in MIXINS}
    geo = api.xnvme_dev_get_geo(dev).contents
    return Handle(api, dev, path, backend, int(geo.lba_nbytes), int(geo.tbytes))


def open_preferring(api: ModuleType, path: str, prefer: tuple[str, ...], direct: bool = False) -> Handle:
    """Open PATH with the first async mixin of PREFER that xNVMe accepts, else with the one it picks itself."""
    for name in (*prefer, None):
        try:
            return open_dev(api, path, name, direct)
        except XnvmeIOError as exc:
            log.debug("xNVMe: %s", exc)
    raise XnvmeIOError(f"xNVMe cannot open {path} with any async backend ({', '.join(prefer)} or its default)")


class Buffer:
    """An aligned I/O buffer from xNVMe's allocator (fit for direct I/O), growing on demand."""

    def __init__(self, api: ModuleType, nbytes: int = 1 << 20, align: int = 4096) -> None:
        self.api, self.align, self.nbytes, self.ptr = api, align, 0, 0
        self.ensure(nbytes)

    def ensure(self, nbytes: int) -> int:
        """The buffer's address, after growing it to at least NBYTES."""
        if nbytes > self.nbytes:
            self.free()
            size = max(nbytes, 2 * self.nbytes)
            ptr = self.api.xnvme_buf_virt_alloc(self.align, size)
            if not ptr:
                raise XnvmeIOError(f"xnvme_buf_virt_alloc({size}) failed: out of memory")
            self.ptr, self.nbytes = int(ptr), size
        return self.ptr

    def bytes_at(self, offset: int, size: int) -> bytes:
        """A copy of SIZE bytes at OFFSET of the buffer."""
        return ctypes.string_at(self.ptr + offset, size)

    def free(self) -> None:
        """Give the memory back."""
        if self.ptr:
            self.api.xnvme_buf_virt_free(ctypes.c_void_p(self.ptr))
            self.ptr, self.nbytes = 0, 0


class Queue:
    """An xNVMe queue of DEPTH commands on HANDLE; submit() retries while the queue is full, drain() waits."""

    BUSY = (-11, -16)  # -EAGAIN, -EBUSY

    def __init__(self, handle: Handle, depth: int) -> None:
        self.api, self.handle, self.depth = handle.api, handle, depth
        self.queue = ctypes.POINTER(handle.api.xnvme_queue)()
        err = self.api.xnvme_queue_init(handle.dev, depth, 0, ctypes.byref(self.queue))
        if err:
            raise XnvmeIOError(f"xnvme_queue_init({handle.path}, depth {depth}) failed ({os.strerror(-err)})")
        self.failed: list[int] = []
        self._cb = self.api.xnvme_queue_cb(self._done)
        self.api.xnvme_queue_set_cb(self.queue, self._cb, None)

    def _done(self, ctx: Any, arg: Any) -> None:
        if (ctx.contents.cpl.status.val >> 1) & 0x7FF:
            self.failed.append(int(arg or 0))
        self.api.xnvme_queue_put_cmd_ctx(self.queue, ctx)

    def submit(self, tag: int, command: Any, *args: Any) -> None:
        """Submit COMMAND(ctx, *ARGS) (xnvme_file_pread, xnvme_nvm_read, ...) tagged TAG for failure reports."""
        ctx = self.api.xnvme_queue_get_cmd_ctx(self.queue)
        getattr(ctx.contents, "async").cb_arg = tag
        while True:
            err = command(ctx, *args)
            if err == 0:
                return
            if err not in self.BUSY:
                self.api.xnvme_queue_put_cmd_ctx(self.queue, ctx)
                raise XnvmeIOError(f"submitting a read to {self.handle.path} failed ({os.strerror(-err)})")
            self.api.xnvme_queue_poke(self.queue, 0)

    def drain(self) -> list[int]:
        """Wait for every submitted command; returns the tags of those that failed (and forgets them)."""
        err = self.api.xnvme_queue_drain(self.queue)
        if err < 0:
            raise XnvmeIOError(f"xnvme_queue_drain({self.handle.path}) failed ({os.strerror(-err)})")
        failed, self.failed = self.failed, []
        return failed

    def close(self) -> None:
        """Terminate the queue."""
        if self.queue:
            self.api.xnvme_queue_term(self.queue)
            self.queue = None
