"""DALI's ``s3://`` reader run in a process of its own, so that the check keeps its deadline whatever DALI does.

A DALI pipeline's deletion waits for its loader thread to finish the batch it prefetches, and DALI's ``s3://`` reader
fetches a batch as one blocking ranged GET per sample member after another: 1.3 s on a quiet machine, 13.3 s measured
in a CI run with the server busy (the 55 k DAG run's check then ended 0.4 s past its 60 s budget). No setting
shortens it, so the check does not wait for it: the turn's reads run in a child process (``python -m
imgest.readback.dali_s3_process``), which sends its verified result back and exits without deleting its pipelines,
and which the check kills at its deadline if it is still reading then (its reads are then lost and the check says
so: :class:`TurnKilled`). The child's start (an interpreter and DALI's import, about 1.3 s) is part of the turn's
start-up; its exit, what the check waits for after the result, is its teardown.

Protocol: the parent writes one pickle (the turn's arguments) to the child's stdin; the child writes lines to its
stdout: ``P <images>`` per batch (the check's progress), then ``R <base64 pickle>`` (its RunResult) or
``E <base64 pickle>`` (the error's type name and message). Anything else the child prints goes to its stderr, which
is the parent's (the task's log).
"""

from __future__ import annotations

import base64
import os
import pickle
import selectors
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from imgest.readback.measure import RunResult


class TurnKilled(RuntimeError):
    """The child was still reading at the check's deadline and was killed: its reads are not reported."""


def run_apart(
    args: dict[str, Any],
    deadline: float | None,
    on_batch: Callable[[int], None] | None = None,
    command: list[str] | None = None,
) -> RunResult:
    """The RunResult of ``readers.run_webdataset(**ARGS)`` run in a child process (COMMAND: the module's own, a
    test's stand-in elsewhere), killed at DEADLINE (``time.perf_counter()``, the same clock in every process of this
    host; None: none); ON_BATCH gets each batch's image count as it is read."""
    command = command or [sys.executable, "-m", "imgest.readback.dali_s3_process"]
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # stderr: the task's log
    assert child.stdin is not None and child.stdout is not None  # noqa: PT018 (both piped above)
    try:
        child.stdin.write(pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL))
        child.stdin.close()
        kind, payload, read = _replies(child, deadline, on_batch)
    finally:
        got = time.perf_counter()
        child.kill()  # after its result it has nothing left to do but delete its pipelines: it need not
        child.wait()
        ended = time.perf_counter()
    if kind == "R":
        result: RunResult = payload
        result.teardown_s = round(ended - got, 3)
        result.settings["process"] = child.pid
        return result
    if kind == "E":
        name, message = payload
        raise RuntimeError(f"{name}: {message}")
    if kind == "K":
        raise TurnKilled(
            f"still reading at the check's deadline after {read} images: its process was killed and its reads are "
            "not reported"
        )
    raise RuntimeError(f"its process ended (exit status {child.returncode}) without a result after {read} images")


def _replies(
    child: subprocess.Popen[bytes], deadline: float | None, on_batch: Callable[[int], None] | None
) -> tuple[str, Any, int]:
    """The child's reply (R, E; K: the deadline came first; "": it ended without one), its payload and the images
    its progress lines counted."""
    assert child.stdout is not None
    fd, buffer, read = child.stdout.fileno(), b"", 0
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            wait = None if deadline is None else deadline - time.perf_counter()
            if wait is not None and wait <= 0:
                return "K", None, read
            if not sel.select(wait):
                continue  # the deadline came: the loop says so
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return "", None, read
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                kind, _, body = line.partition(b" ")
                if kind == b"P":
                    read += int(body)
                    if on_batch:
                        on_batch(int(body))
                elif kind in (b"R", b"E"):
                    return kind.decode(), pickle.loads(base64.b64decode(body)), read


def main() -> None:
    """The child: read the turn's arguments, read the shards, send the result, exit without deleting the pipelines."""
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # what DALI or a library prints goes to the log, not into the replies
    args = pickle.loads(sys.stdin.buffer.read())

    def send(kind: str, body: bytes) -> None:
        out.write(kind.encode() + b" " + body + b"\n")

    try:
        from imgest.readback.readers import run_webdataset

        result = run_webdataset(**args, on_batch=lambda n: send("P", str(n).encode()), teardown=False)
        send("R", base64.b64encode(pickle.dumps(result)))
    except BaseException as exc:  # every failure goes back as a reply
        message = str(exc).splitlines()[0][:300] if str(exc) else ""
        send("E", base64.b64encode(pickle.dumps((type(exc).__name__, message))))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no pipeline deletion: the parent does not wait for it (the module)


if __name__ == "__main__":
    main()
