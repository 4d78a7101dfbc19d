"""A TCP relay in front of a real Cassandra node that reads the CQL frames going by (protocol v4: a 9-byte header,
``version flags stream:int16 opcode length:int32``, then the body, compressed or not) and counts the EXECUTE requests
in flight: sent by a client and not yet answered on the same connection and stream. It observes the wire, not the
code under test, so a scan's "at most N in flight on a node" is checked where the node sees it.

    with CqlWire(node_host, node_port) as wire:
        ...connect a driver to wire.port (protocol 4) and run the scan...
    wire.peak  # the most EXECUTEs in flight at once; wire.executes: how many were sent
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from types import TracebackType

EXECUTE = 0x0A
HEADER = struct.Struct(">BBhBi")


class CqlWire:
    """Relays 127.0.0.1:<port> to HOST:PORT, counting EXECUTE requests in flight across all connections."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[tuple[int, int]] = set()  # (connection, stream) of unanswered EXECUTEs
        self.peak = self.executes = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> CqlWire:
        self._spawn(self._accept)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._listener.close()

    def reset(self) -> None:
        """Forget the counts so far (the requests still open stay counted as open)."""
        with self._lock:
            self.peak, self.executes = len(self._open), 0

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads.append(thread)

    def _accept(self) -> None:
        conn_id = 0
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            conn_id += 1
            self._spawn(self._pump, client, server, conn_id, True)
            self._spawn(self._pump, server, client, conn_id, False)

    def _pump(self, src: socket.socket, dst: socket.socket, conn_id: int, requests: bool) -> None:
        buffer = b""
        try:
            while chunk := src.recv(65536):
                buffer += chunk
                while len(buffer) >= HEADER.size:
                    _, _, stream, opcode, length = HEADER.unpack_from(buffer)
                    if len(buffer) < HEADER.size + length:
                        break
                    self._frame(conn_id, stream, opcode, requests)
                    buffer = buffer[HEADER.size + length :]
                dst.sendall(chunk)  # counted before it is passed on: an answer cannot overtake its request
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _frame(self, conn_id: int, stream: int, opcode: int, request: bool) -> None:
        with self._lock:
            if request and opcode == EXECUTE:
                self._open.add((conn_id, stream))
                self.executes += 1
                self.peak = max(self.peak, len(self._open))
            elif not request:
                self._open.discard((conn_id, stream))
