"""A Cassandra node's heap, direct memory and SSTable counts over a benchmark, sampled through its local JMX port.

The node's direct memory is what killed it under a split scan after a bulk load (``Cannot reserve ... direct buffer
memory``), and no CQL table shows it, so the benchmark asks the JVM: ``java.nio:type=BufferPool,name=direct`` and
``java.lang:type=Memory`` through a small JMX client (``java/NodeMemory.java``, run by Java's source launcher) that
prints a JSON line per sample; the tables' ``LiveSSTableCount`` metric rides along.

    with NodeMemory("127.0.0.1:7199", tables=["ks.train_meta"]) as node:
        run_the_step()
    node.summary()  # {"peak_heap_mib": ..., "peak_direct_mib": ..., "sstables": {...}, "samples": ...}
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("java") / "NodeMemory.java"
MIB = 1 << 20


class NodeMemory:
    """Samples the JVM behind JMX ADDRESS ('host:port') every INTERVAL_MS while the block runs; keeps the peaks, the
    last SSTable count of each of TABLES and the largest one seen."""

    def __init__(self, address: str, tables: list[str] | None = None, interval_ms: int = 250) -> None:
        self.address, self.tables, self.interval_ms = address, list(tables or []), interval_ms
        self.samples = self.errors = 0
        self.peak_heap = self.peak_direct = self.peak_mapped = self.heap_max = 0
        self.sstables: dict[str, int | None] = {}
        self.peak_sstables: dict[str, int] = {}
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> NodeMemory:
        java = shutil.which("java")
        if java is None:
            raise FileNotFoundError("java is not on PATH: the node's memory is sampled through JMX by a Java client")
        cmd = [
            java,
            "-Xmx64m",
            "-XX:TieredStopAtLevel=1",
            str(SOURCE),
            self.address,
            str(self.interval_ms),
            *self.tables,
        ]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read, name="node-memory", daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        if self._proc is None or self._proc.stdout is None:
            return
        for line in self._proc.stdout:
            try:
                sample = json.loads(line)
            except ValueError:
                continue
            self.take(sample)

    def take(self, sample: dict[str, Any]) -> None:
        """Fold one JSON sample of the client into the peaks."""
        if "error" in sample:
            self.errors += 1
            return
        self.samples += 1
        self.peak_heap = max(self.peak_heap, sample["heap"])
        self.peak_direct = max(self.peak_direct, sample["direct"])
        self.peak_mapped = max(self.peak_mapped, sample.get("mapped", 0))
        self.heap_max = sample["heap_max"]
        for table, count in sample.get("sstables", {}).items():
            self.sstables[table] = count
            if count is not None:
                self.peak_sstables[table] = max(self.peak_sstables.get(table, 0), count)

    def set_tables(self, tables: list[str]) -> None:
        """Follow TABLES from the next start (a new client: the table names are its arguments)."""
        self.tables = list(tables)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._proc is not None:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)

    def summary(self) -> dict[str, Any]:
        """Peaks in MiB, the heap's limit, the SSTable counts (last and largest) and how many samples they rest on."""
        return {
            "peak_heap_mib": round(self.peak_heap / MIB),
            "heap_max_mib": round(self.heap_max / MIB),
            "peak_direct_mib": round(self.peak_direct / MIB),
            "peak_mapped_mib": round(self.peak_mapped / MIB),
            "sstables": dict(self.sstables),
            "peak_sstables": dict(self.peak_sstables),
            "samples": self.samples,
            "sample_errors": self.errors,
        }
