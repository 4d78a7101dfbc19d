"""Detached service processes: start, PID files, readiness waits, port checks, stop."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from imgest.core.errors import ServiceError
from imgest.core.pids import pid_alive

# Java/Python error lines, and glog's E/F lines (SeaweedFS): 'E1121 05:28:44.1 ...'.
_ERROR_LINE = re.compile(r"\b(ERROR|FATAL|Exception|Error:)|^[EF]\d{4} ")


@dataclass(frozen=True)
class ManagedProcess:
    """A service process that imgest started, remembered by a PID file."""

    name: str
    pid_file: Path
    log_file: Path

    def pid(self) -> int | None:
        """The recorded PID if that process is still alive, else None (a stale file is removed)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        if pid_alive(pid):
            return pid
        self.pid_file.unlink(missing_ok=True)
        return None

    def start(self, argv: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> int:
        """Start ARGV in its own session, output appended to the log file; returns the PID."""
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.chmod(self.log_file, 0o600)  # logs may hold generated passwords (airflow standalone prints one)
            with os.fdopen(fd, "ab") as log:
                proc = subprocess.Popen(
                    list(argv),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    cwd=cwd,
                    start_new_session=True,
                    umask=0o077,  # what the service writes (DBs, generated passwords, logs) is private
                )
        except FileNotFoundError as exc:
            raise ServiceError(f"{self.name}: cannot run {argv[0]!r}: {exc.strerror}") from exc
        self.pid_file.write_text(f"{proc.pid}\n")
        return proc.pid

    def wait_ready(self, ready: Callable[[], bool], timeout: float, what: str) -> float:
        """Poll READY until true; fail fast if the process dies. Returns the seconds waited."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if ready():
                return time.monotonic() - t0
            if self.pid() is None:
                cause = last_error_line(self.log_file)
                raise ServiceError(f"{self.name} exited during start: {cause} (log: {self.log_file})")
            time.sleep(0.25)
        raise ServiceError(f"{self.name} did not answer {what} within {timeout:.0f}s (log: {self.log_file})")

    def stop(self, timeout: float = 30.0) -> bool:
        """SIGTERM the process group, SIGKILL after TIMEOUT. False if nothing was running."""
        pid = self.pid()
        if pid is None:
            return False
        _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and pid_alive(pid):
            time.sleep(0.2)
        if pid_alive(pid):
            _signal_group(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        return True


def stop_all(processes: Sequence[ManagedProcess], timeout: float = 30.0) -> list[bool]:
    """Stop PROCESSES together: SIGTERM every group at once, then wait (each shuts down in parallel with the
    others), SIGKILL what is left after TIMEOUT. One bool per process: False if it was not running."""
    pids = [p.pid() for p in processes]
    for pid in pids:
        if pid is not None:
            _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(pid is not None and pid_alive(pid) for pid in pids):
        time.sleep(0.2)
    for proc, pid in zip(processes, pids, strict=True):
        if pid is not None:
            if pid_alive(pid):
                _signal_group(pid, signal.SIGKILL)
            proc.pid_file.unlink(missing_ok=True)
    return [pid is not None for pid in pids]


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return
    except PermissionError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True if something accepts TCP connections on HOST:PORT."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=timeout):
        return True
    return False


def require_free_port(service: str, host: str, port: int, env_var: str) -> None:
    """Raise a one-line ServiceError if HOST:PORT is already taken by another process."""
    if port_open(host, port):
        raise ServiceError(
            f"{service}: port {host}:{port} is already taken by another process; "
            f"stop it or choose another port with {env_var}"
        )


def last_error_line(log_file: Path, scan_bytes: int = 65536) -> str:
    """The most telling line at the end of a log: the last ERROR/Exception line, else the last line."""
    try:
        with open(log_file, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - scan_bytes))
            lines = [ln.strip() for ln in fh.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except FileNotFoundError:
        return "no log was written"
    for line in reversed(lines):
        if _ERROR_LINE.search(line):
            return line[:300]
    return lines[-1][:300] if lines else "the log is empty"


def which_or_fail(service: str, program: str, hint: str) -> str:
    """Absolute path of PROGRAM on PATH, or a ServiceError naming it and how to install it."""
    from shutil import which

    path = which(program)
    if path is None:
        raise ServiceError(f"{service}: {program!r} not found on PATH; {hint}")
    return path
