"""The block device under a path, and whether this process may read it."""

from __future__ import annotations

import grp
import os
import stat
from pathlib import Path

from imgest.core.errors import ImgestError


class NoBlockDeviceError(ImgestError):
    """A path lives on a filesystem with no block device under it (tmpfs, overlay, NFS, ...)."""


class DeviceAccessError(ImgestError):
    """A block device exists but cannot be opened for reading."""


def device_of(path: Path, sys_root: Path = Path("/sys"), dev_root: Path = Path("/dev")) -> Path:
    """The block device node holding PATH's filesystem (a partition, loop or dm device), or NoBlockDeviceError."""
    st_dev = os.stat(path).st_dev
    major, minor = os.major(st_dev), os.minor(st_dev)
    link = sys_root / "dev" / "block" / f"{major}:{minor}"
    if major == 0 or not link.exists():
        raise NoBlockDeviceError(
            f"{path} is on device {major}:{minor}, which is no block device (tmpfs, overlay, NFS?)"
        )
    node = dev_root / link.resolve().name
    if not node.exists():
        raise NoBlockDeviceError(f"{path} is on block device {major}:{minor}, but {node} does not exist")
    return node


def check_readable(device: Path) -> None:
    """Return when DEVICE opens for reading; else DeviceAccessError naming it and the permission needed."""
    try:
        fd = os.open(device, os.O_RDONLY)
    except PermissionError:
        info = os.stat(device)
        try:
            group = grp.getgrgid(info.st_gid).gr_name
        except KeyError:
            group = str(info.st_gid)
        if os.geteuid() == 0:
            need = "even root is refused here, so the device cgroup or a security module forbids it (a container?)"
        else:
            need = f"run as root or join group '{group}'"
        raise DeviceAccessError(
            f"cannot open block device {device} for reading (mode {stat.filemode(info.st_mode)}, group {group}): "
            f"reading files by LBA needs read permission on it: {need}"
        ) from None
    except OSError as exc:
        raise DeviceAccessError(f"cannot open block device {device}: {exc.strerror}") from None
    os.close(fd)
