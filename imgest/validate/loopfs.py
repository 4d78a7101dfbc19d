"""A filesystem image on a loop device, mounted, with a dataset copied in: where the block engine can read by LBA.

Needs root (losetup, mount). Where loop devices or mounting are not permitted, LoopUnavailableError says why, so
callers skip the block engine with that reason.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from imgest.core.errors import ImgestError

log = logging.getLogger(__name__)
FILESYSTEMS = ("ext4", "xfs")
MKFS = {"ext4": ["mkfs.ext4", "-q", "-F"], "xfs": ["mkfs.xfs", "-q", "-f"]}
MIN_MB = {"ext4": 16, "xfs": 320}  # mkfs.xfs refuses filesystems under 300 MB


class LoopUnavailableError(ImgestError):
    """No loop-mounted filesystem can be made here (not root, no loop devices, mount refused, no mkfs)."""


@dataclass(frozen=True)
class LoopMount:
    """A mounted filesystem image: its loop device, its mount point and its type."""

    device: Path
    mountpoint: Path
    fstype: str
    image: Path | None = None  # the filesystem image file behind the loop device


def _run(cmd: list[str], what: str) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise LoopUnavailableError(f"{what}: {cmd[0]} is not installed") from None
    if proc.returncode != 0:
        raise LoopUnavailableError(f"{what}: {' '.join(cmd)} failed: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout.strip()


BLOCK = 4096


def image_size_mb(nbytes: int, files: int, fstype: str) -> int:
    """An image size that holds FILES files of NBYTES bytes in all, with room for the filesystem's own structures."""
    used = nbytes + files * BLOCK  # each file's last block is partly empty
    return max(MIN_MB[fstype], int(used * 1.3 / 2**20) + 32)


@contextmanager
def loop_mounted(work: Path, size_mb: int, fstype: str = "ext4") -> Iterator[LoopMount]:
    """An empty FSTYPE filesystem of SIZE_MB on a loop device, mounted under WORK; torn down on exit."""
    if fstype not in MKFS:
        raise LoopUnavailableError(f"unsupported filesystem {fstype!r}; choose from {', '.join(FILESYSTEMS)}")
    if shutil.which(MKFS[fstype][0]) is None:
        raise LoopUnavailableError(
            f"{MKFS[fstype][0]} is not installed (Debian: apt-get install "
            f"{'xfsprogs' if fstype == 'xfs' else 'e2fsprogs'})"
        )
    work.mkdir(parents=True, exist_ok=True)
    image, mountpoint = work / f"{fstype}.img", work / f"mnt-{fstype}"
    with open(image, "wb") as fh:
        fh.truncate(size_mb * 2**20)
    try:
        _run([*MKFS[fstype], str(image)], f"making an {fstype} filesystem")
        device = Path(_run(["losetup", "--find", "--show", str(image)], "attaching a loop device"))
        try:
            mountpoint.mkdir(exist_ok=True)
            _run(["mount", "-t", fstype, str(device), str(mountpoint)], f"mounting {device}")
            try:
                log.info("loop filesystem %s on %s mounted at %s", fstype, device, mountpoint)
                yield LoopMount(device, mountpoint, fstype, image)
            finally:
                _run(["umount", str(mountpoint)], f"unmounting {mountpoint}")
        finally:
            _run(["losetup", "--detach", str(device)], f"detaching {device}")
    finally:
        image.unlink(missing_ok=True)


def copy_in(dataset: Path, mount: LoopMount, files: Iterable[str] | None = None) -> Path:
    """Copy DATASET into the mounted filesystem and sync it to the device; returns the copy's root.

    Given FILES (paths relative to DATASET), only those are copied, with the dataset's top-level files (manifest,
    samples.parquet) and every ``<split>/<class>`` folder, empty or not, so DALI's file reader labels the copy the
    way it labels the dataset.
    """
    dest = mount.mountpoint / dataset.name
    if files is None:
        shutil.copytree(dataset, dest, dirs_exist_ok=True)
    else:
        dest.mkdir(parents=True, exist_ok=True)
        for top in dataset.iterdir():
            if top.is_file():
                shutil.copy2(top, dest / top.name)
            elif top.is_dir():
                for sub in top.iterdir():
                    if sub.is_dir():
                        (dest / top.name / sub.name).mkdir(parents=True, exist_ok=True)
        for rel in files:
            shutil.copy2(dataset / rel, dest / rel)
    _run(["sync", "-f", str(dest)], f"syncing {dest}")
    return dest
