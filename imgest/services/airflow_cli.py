"""A warm `airflow` CLI for the test suite: one process per Airflow configuration that has imported Airflow once
and forks a child for each command.

Every `airflow` command is a fresh Python process that imports Airflow and its CLI (4 s of CPU on two cores);
`airflow dags test` then builds the in-process task execution API (another 4 s, mostly Cadwyn's versioned
routes) and its tasks import DALI, webdataset (and so torch) and matplotlib. The suite runs about twenty such
commands. With $IMGEST_AIRFLOW_CLI_DIR set, `AirflowServer.airflow` sends the command to a server that has done
all of that once (`warm`): it forks, and the child takes the
caller's environment, working folder, umask and output descriptors, then runs the entry point of the `airflow`
script (``airflow.__main__.main``) with the command's arguments. The command is the same; only the imports were
paid in advance. Airflow itself forks warm processes the same way (its LocalExecutor and task supervisor).

A server serves the configuration it was started with (AIRFLOW_HOME and every AIRFLOW__ setting, which Airflow
reads at import; not the connections and variables of the environment, which the child reads); a command with
another gets a server of its own. Without the variable, or when a server
cannot start, the command runs as a subprocess of the `airflow` script.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import hashlib
import importlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import IO, Any

from imgest.core import unixserver

log = logging.getLogger(__name__)

DIR_ENV = "IMGEST_AIRFLOW_CLI_DIR"
START_TIMEOUT_S = 180.0
IDLE_EXIT_S = 3600.0  # a server nobody stopped (a killed test session) goes away on its own
# Modules a command imports lazily, imported once by the server: the CLI's parser and the commands the suite runs,
# then what imgest's DAG files and their tasks import in a `dags test` (webdataset alone is 2 s: it imports torch).
# None of them starts a thread or reads the environment at import.
WARM_MODULES = (
    "airflow.__main__",
    "airflow.cli.commands.dag_command",
    "airflow.cli.commands.connection_command",
    "airflow.cli.commands.db_command",
    "airflow.sdk.definitions.dag",
    "imgest.flow.request",
    "cassandra.cluster",
    "boto3",
    "pyarrow.parquet",
    "PIL.Image",
    "webdataset",
    "nvidia.dali",
    "matplotlib.pyplot",
)


def server_key(env: dict[str, str]) -> str:
    """What a server's imports depend on: the Python, AIRFLOW_HOME, the AIRFLOW__ settings and PYTHONPATH. Not the
    connections and variables of the environment (AIRFLOW_CONN_*, AIRFLOW_VAR_*): Airflow reads those when a task
    asks for one, in the child."""
    wanted = {
        k: v
        for k, v in env.items()
        if (k.startswith("AIRFLOW") and not k.startswith(("AIRFLOW_CONN_", "AIRFLOW_VAR_"))) or k == "PYTHONPATH"
    }
    text = json.dumps([sys.executable, sorted(wanted.items())])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _socket_for(env: dict[str, str]) -> Path | None:
    folder = os.environ.get(DIR_ENV, "").strip()
    return Path(folder) / f"{server_key(env)}.sock" if folder else None


class WarmCommand:
    """One command running in a child of the warm server: ``poll``, ``wait`` and ``returncode`` as a Popen's."""

    def __init__(self, conn: socket.socket, argv: list[str], stdout: IO[str] | None = None) -> None:
        self.args = argv
        self.returncode: int | None = None
        self.stdout = stdout  # the read end of its output, when started by `popen`
        self._conn = conn
        self._buffer = b""

    def poll(self) -> int | None:
        """The exit code once the command has ended, else None (never blocks)."""
        if self.returncode is None and select.select([self._conn], [], [], 0)[0]:
            self._read()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the command to end; raises subprocess.TimeoutExpired after TIMEOUT seconds."""
        if self.returncode is None:
            if not select.select([self._conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._read()
        assert self.returncode is not None
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, None]:
        """Its whole output (stdout and stderr together, from `popen`) once it has ended; raises
        subprocess.TimeoutExpired, with the output so far, when that takes more than TIMEOUT seconds."""
        assert self.stdout is not None, "communicate needs a command started by popen"
        deadline = None if timeout is None else time.monotonic() + timeout
        fd, chunks = self.stdout.fileno(), []
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], left)[0]:
                so_far = b"".join(chunks).decode(errors="replace")
                raise subprocess.TimeoutExpired(self.args, timeout or 0, output=so_far)
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        self.stdout.close()
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        self.wait(left)
        return b"".join(chunks).decode(errors="replace"), None

    def _read(self) -> None:
        while b"\n" not in self._buffer:
            chunk = self._conn.recv(4096)
            if not chunk:  # the child died without answering (a signal, a crash): as a shell reports it
                self._buffer = b'{"rc": 255}\n'
                break
            self._buffer += chunk
        self.returncode = int(json.loads(self._buffer.split(b"\n", 1)[0])["rc"])
        self._conn.close()


def spawn(args: list[str], env: dict[str, str], stdout: int, stderr: int, umask: int = 0o077) -> WarmCommand | None:
    """Start `airflow ARGS` in the warm server for ENV, its output on the descriptors STDOUT and STDERR (the
    child gets duplicates); None when no server is configured or one cannot start."""
    path = _socket_for(env)
    if path is None:
        return None
    conn = unixserver.try_connect(path)
    if conn is None:
        argv = [sys.executable, "-m", "imgest.services.airflow_cli", "--socket", str(path)]
        conn = unixserver.start(path, argv, env, START_TIMEOUT_S)
        if conn is None:
            log.warning("the warm airflow CLI did not start (see %s); running airflow itself", path.with_suffix(".log"))
            return None
    request = {"args": list(args), "env": env, "cwd": os.getcwd(), "umask": umask}
    data = json.dumps(request).encode() + b"\n"
    sent = socket.send_fds(conn, [data], [stdout, stderr])
    if sent < len(data):
        conn.sendall(data[sent:])
    return WarmCommand(conn, ["airflow", *args])


def popen(args: list[str], env: dict[str, str]) -> WarmCommand | None:
    """`airflow ARGS` in the warm server with stdout and stderr on one pipe (its ``stdout``), as
    ``subprocess.Popen(..., stdout=PIPE, stderr=STDOUT, text=True)``; None when it must run as a subprocess."""
    if _socket_for(env) is None:
        return None
    read, write = os.pipe()
    try:
        command = spawn(args, env, write, write)
    finally:
        os.close(write)
    if command is None:
        os.close(read)
        return None
    command.stdout = os.fdopen(read, "r", errors="replace")
    return command


def run(args: list[str], env: dict[str, str], capture: bool = True) -> subprocess.CompletedProcess[str] | None:
    """`airflow ARGS` in the warm server, as ``subprocess.run(..., text=True, capture_output=CAPTURE)`` would
    return it; None when it must run as a subprocess."""
    if _socket_for(env) is None:
        return None
    with _output(capture) as (out, err):
        command = spawn(args, env, out.fileno(), err.fileno())
        if command is None:
            return None
        rc = command.wait()
        texts = [_read_back(f) if capture else None for f in (out, err)]
    return subprocess.CompletedProcess(["airflow", *args], rc, texts[0], texts[1])


@contextlib.contextmanager
def _output(capture: bool) -> Any:
    if not capture:
        sys.stdout.flush()
        sys.stderr.flush()
        yield sys.stdout, sys.stderr
        return
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        yield out, err


def _read_back(fh: IO[bytes]) -> str:
    fh.seek(0)
    return fh.read().decode(errors="replace")


def stop_all(folder: Path) -> int:
    """Stop every warm server under FOLDER; returns how many were running."""
    return sum(unixserver.stop(path) for path in sorted(folder.glob("*.sock")))


# ---------------------------------------------------------------------------------------------- the server side


def warm() -> float:
    """Import Airflow, its CLI, the commands the suite runs and what their tasks import; build the in-process task
    execution API that `dags test` serves its tasks from, with Cadwyn's versioned routes (4 s, built at an app's
    first request otherwise), as the one every InProcessExecutionAPI of a child returns. Returns the CPU seconds."""
    t0 = time.process_time()
    for name in WARM_MODULES:
        with contextlib.suppress(ImportError):  # an optional one (DALI, webdataset) missing: the child imports less
            importlib.import_module(name)
    from airflow.api_fastapi.execution_api.app import InProcessExecutionAPI
    from airflow.cli import cli_parser

    cli_parser.get_parser()
    app = InProcessExecutionAPI().app  # the app, its DAG bag and its in-process auth, as `dags test` builds them
    initialize = getattr(app, "_cadwyn_initialize", None)
    if callable(initialize) and not getattr(app, "_cadwyn_initialized", True):
        initialize()
    InProcessExecutionAPI.app = property(lambda _self: app)  # type: ignore[assignment,method-assign]
    return time.process_time() - t0


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 2)
    while data and not data.endswith(b"\n"):
        chunk = conn.recv(1 << 16)
        if not chunk:
            break
        data += chunk
    return (json.loads(data) if data.strip() else {}), list(fds)


def _child(conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become the caller's `airflow` command, answer its exit code, exit."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the server ignores its children; this command waits for its own
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in (null, *fds):
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    os.umask(int(request["umask"]))
    sys.argv = [str(Path(sys.executable).parent / "airflow"), *request["args"]]
    rc = 0
    try:
        from airflow.__main__ import main

        main()
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:  # as the script would: the trace on stderr, exit 1
        traceback.print_exc()
        rc = 1
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()  # what the interpreter runs at a normal exit (log handlers, the ORM)
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps({"rc": rc}).encode() + b"\n")
    os._exit(rc)


def serve(path: Path) -> None:
    """Warm up, then fork a child per command received on the Unix socket PATH until asked to stop."""
    cpu = warm()  # Airflow configures logging as it does in any `airflow` process; the server's own lines
    handler = logging.StreamHandler(sys.stderr)  # go to its log through a handler that its children drop
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    if threading.active_count() > 1:  # a fork copies only the forking thread: a lock another held stays held
        log.warning("threads running before the first fork: %s", [t.name for t in threading.enumerate()])
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    listener.settimeout(IDLE_EXIT_S)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel; each answers its caller
    log.info(
        "warm airflow CLI (AIRFLOW_HOME=%s) ready on %s after %.1f CPU s", os.environ.get("AIRFLOW_HOME"), path, cpu
    )
    commands = 0
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            log.info("idle for %.0f s: exiting", IDLE_EXIT_S)
            break
        conn.settimeout(None)
        request, fds = _receive(conn)
        if request.get("stop") or len(fds) != 2:
            conn.sendall(b'{"stopped": true}\n' if request.get("stop") else b'{"rc": 2}\n')
            conn.close()
            for fd in fds:
                os.close(fd)
            if request.get("stop"):
                break
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            listener.close()
            log.removeHandler(handler)
            log.propagate = True
            _child(conn, request, fds)
        commands += 1
        log.info("command %d: airflow %s (pid %d)", commands, " ".join(request["args"])[:200], pid)
        conn.close()
        for fd in fds:
            os.close(fd)
    listener.close()
    path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", type=Path, required=True, help="Unix socket to listen on")
    args = parser.parse_args(argv)
    serve(args.socket)
    return 0


if __name__ == "__main__":
    sys.exit(main())
