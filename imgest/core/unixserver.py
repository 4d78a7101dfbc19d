"""The client side shared by the suite's helper servers (the reused Spark driver, the warm Airflow CLI): each
listens on a Unix socket, writes its pid beside it (PATH.pid) and its log (PATH.log), reads one JSON line per
request and stops on ``{"stop": true}``."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from pathlib import Path


def try_connect(path: Path) -> socket.socket | None:
    """A connection to the server listening on PATH, or None when none answers there."""
    if not path.exists():
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except OSError:
        conn.close()
        return None
    return conn


def start(path: Path, argv: list[str], env: dict[str, str] | None, timeout: float) -> socket.socket | None:
    """Start the server ARGV (which listens on PATH) in a session of its own, output to PATH.log; a connection
    once it answers, None if it exits or does not answer within TIMEOUT seconds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".log"), "a") as fh:
        proc = subprocess.Popen(
            argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
    path.with_suffix(".pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        conn = try_connect(path)
        if conn is not None:
            return conn
        time.sleep(0.2)
    return None  # the caller says what runs instead; the server's own output is in PATH.log


def stop(path: Path, timeout: float = 30.0) -> bool:
    """Ask the server at PATH (if any) to stop and wait for its process; True when one was running."""
    conn = try_connect(path)
    pid_file = path.with_suffix(".pid")
    if conn is None:
        return False
    with conn:
        conn.sendall(b'{"stop": true}\n')
        conn.makefile("rb").readline()
    pid = int(pid_file.read_text()) if pid_file.is_file() else None
    deadline = time.monotonic() + timeout
    while pid is not None and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):  # the caller that started it reaps it
            os.waitpid(pid, os.WNOHANG)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    for leftover in (path, pid_file):
        leftover.unlink(missing_ok=True)
    return True
