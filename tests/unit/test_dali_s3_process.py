"""DALI's s3:// turn in a process of its own (imgest.readback.dali_s3_process): the check gets its result and its
progress, never waits for its pipelines' deletion, and kills it at the check's deadline.

The children here are stand-ins (a few lines of Python, run as real processes) for what cannot be produced on demand:
a DALI reader still reading at the deadline, or one that dies without a word. The real child reading real shards on
a real S3 server: tests/readback/test_parallel_dali.py."""

from __future__ import annotations

import base64
import os
import pickle
import sys
import time
from pathlib import Path

import pytest

from imgest.readback.dali_s3_process import TurnKilled, run_apart
from imgest.readback.measure import RunResult


def _child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_its_result_and_progress_come_back_and_it_is_not_waited_for(tmp_path: Path) -> None:
    reply = base64.b64encode(pickle.dumps(RunResult("shards-s3-dali", "raw", "cpu", images=7))).decode()
    pid_file = tmp_path / "pid"
    code = (
        f"import os, sys, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); sys.stdin.buffer.read(); "
        f"print('P 3'); print('P 4'); print('R {reply}', flush=True); time.sleep(600)"  # its pipelines' deletion
    )
    seen: list[int] = []
    result = run_apart({"name": "x"}, None, seen.append, command=_child(code))
    assert (result.images, seen) == (7, [3, 4])
    assert result.settings["process"] == int(pid_file.read_text()) != os.getpid()
    with pytest.raises(ProcessLookupError):  # killed and reaped once its result came, not left behind
        os.kill(result.settings["process"], 0)


def test_a_turn_still_reading_at_the_deadline_is_killed_and_says_how_far_it_got(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); print('P 16', flush=True); "
    code += "time.sleep(600)"
    deadline = time.perf_counter() + 2.0
    with pytest.raises(TurnKilled, match="still reading at the check's deadline after 16 images"):
        run_apart({"name": "x"}, deadline, command=_child(code))
    assert time.perf_counter() >= deadline  # it was given its whole time, then killed
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


def test_a_turn_that_dies_without_a_result_is_an_error_naming_its_exit_status() -> None:
    with pytest.raises(RuntimeError, match=r"ended \(exit status 3\) without a result after 5 images"):
        run_apart({"name": "x"}, None, command=_child("print('P 5', flush=True); raise SystemExit(3)"))


def test_the_real_child_sends_back_the_readers_error() -> None:
    """The module's own child, given arguments its reader refuses: the error's type and message come back."""
    with pytest.raises(RuntimeError, match=r"^TypeError: run_webdataset\(\) missing 3 required positional arguments"):
        run_apart({"name": "shards-s3-dali"}, time.perf_counter() + 120)
