"""cassandra-dali-plugin's reader ``fn.crs4.cassandra`` over an imgest ReadSet, measured like imgest's readers.

The operator returns (encoded bytes, label) and no id, so each sample is identified by the sha256 of its bytes
(the column imgest records at ingest): every sample must match a row of the ReadSet not yet read this epoch, with
the same label, and every row must come once (identical images under several ids are told apart by label, then
taken in turn). The pipeline behind it is the one every imgest reader feeds (raw bytes or the CPU training
graph), so the figures compare the readers and nothing else.
"""

from __future__ import annotations

import collections
import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from imgest.core.settings import CassandraSettings
from imgest.peers.crs4 import load_plugin
from imgest.readback.datasets import ReadSet
from imgest.readback.measure import RunResult, Verifier, measure
from imgest.readback.pipelines import READER, PipelineSpec, build_pipeline


@dataclass(frozen=True)
class Crs4Preset:
    """The plugin's reader knobs (names as its operator has them)."""

    name: str
    prefetch_buffers: int
    io_threads: int
    comm_threads: int
    copy_threads: int
    wait_threads: int = 2
    ooo: bool = False
    slow_start: int = 0

    def knobs(self) -> dict[str, Any]:
        """The operator arguments of this preset."""
        return {k: v for k, v in self.__dict__.items() if k != "name"}


PRESETS = {
    # the operator's own defaults (crs4/cpp/cassandra_dali_interactive.cc)
    "defaults": Crs4Preset("defaults", prefetch_buffers=1, io_threads=2, comm_threads=2, copy_threads=2),
    # what its example scripts pass (examples/imagenette/loop_read.py)
    "examples": Crs4Preset("examples", 4, 12, 1, 4, ooo=True, slow_start=4),
    # its long-fat-network figure (docs/LFN.md: 16 buffers, 8 I/O threads, 1 comm, 4 copy; ooo, slow start 4)
    "lfn": Crs4Preset("lfn", 16, 8, 1, 4, ooo=True, slow_start=4),
}


def crs4_reader_args(settings: CassandraSettings, table: str, ids: Sequence[str], preset: Crs4Preset) -> dict[str, Any]:
    """The keyword arguments of ``fn.crs4.cassandra`` reading TABLE's rows IDS (UUID strings) with SETTINGS."""
    return {
        "name": READER,
        "cloud_config": "",
        "cassandra_ips": list(settings.hosts),
        "cassandra_port": settings.port,
        "username": settings.username or "",
        "password": settings.password or "",
        "use_ssl": bool(settings.ssl_ca_file),
        "ssl_certificate": settings.ssl_ca_file or "",
        "ssl_own_certificate": settings.ssl_cert_file or "",  # mutual TLS (files: the plugin reads paths)
        "ssl_own_key": settings.ssl_key_file or "",
        "ssl_own_key_pass": "",
        "table": table,
        "label_col": "label",
        "data_col": "data",
        "id_col": "id",
        "label_type": "int",
        "source_uuids": [str(uuid.UUID(i)) for i in ids],
        "shuffle_every_epoch": True,
        "loop_forever": True,
        **preset.knobs(),
    }


def crs4_pipeline(spec: PipelineSpec, reader_args: dict[str, Any]) -> Any:
    """The imgest pipeline (raw or train, per SPEC) behind ``fn.crs4.cassandra(**READER_ARGS)``."""
    load_plugin()
    from nvidia.dali import fn

    def graph() -> tuple[Any, ...]:
        jpegs, labels = fn.crs4.cassandra(**reader_args)
        return jpegs, labels

    return build_pipeline(spec, graph)


class ContentVerifier(Verifier):
    """Names each sample of the plugin's reader by its bytes: the sha256 must be one a row of the ReadSet recorded,
    with the same label. STRICT (in-order presets): every row exactly once per epoch. Not strict (``ooo``, which the
    plugin documents as mixing batches, and so the end of one epoch with the start of the next): the run's tally
    is checked by :func:`check_tally` instead."""

    def __init__(self, rs: ReadSet, by_sha: dict[bytes, list[int]], tally: np.ndarray, strict: bool) -> None:
        super().__init__(rs)
        self.by_sha, self.tally, self.strict = by_sha, tally, strict

    def check(self, key: str, label: int, data: np.ndarray, sha256: str | None) -> None:
        digest = hashlib.sha256(data.tobytes()).digest()
        rows = self.by_sha.get(digest)
        if not rows:
            self._problem(f"a sample whose bytes (sha256 {digest.hex()[:12]}...) no row of the version recorded")
            return
        same = [j for j in rows if int(self.rs.labels[j]) == label]
        if not same:
            want = int(self.rs.labels[rows[0]])
            self._problem(f"{self.rs.ids[rows[0]].decode()}: label {label}, recorded {want}")
            return
        j = min(same, key=lambda k: (self.seen[k], self.tally[k]))  # identical images: the least read first
        if self.strict and self.seen[j]:
            self._problem(f"{self.rs.ids[j].decode()}: read twice in one epoch")
        self.seen[j] = True
        self.tally[j] += 1

    def finish(self) -> list[str]:
        if not self.strict:
            self.seen[:] = True  # per epoch, only integrity: the run's tally says whether every row came
        return super().finish()


def content_index(rs: ReadSet) -> dict[bytes, list[int]]:
    """sha256 (raw 32 bytes) -> the ReadSet rows that recorded it."""
    by_sha: dict[bytes, list[int]] = collections.defaultdict(list)
    for i in range(len(rs)):
        if rs.rows["recorded"][i]:
            by_sha[rs.rows["sha256"][i].tobytes()].append(i)
    return by_sha


def check_tally(rs: ReadSet, tally: np.ndarray, epochs: int, blur: int = 1) -> list[str]:
    """Out-of-order runs: EPOCHS epochs read every row EPOCHS times, give or take BLUR (the epochs the reader's
    requests ahead span: one boundary, or more where its window is larger than the dataset), and EPOCHS x rows
    samples in all."""
    problems = []
    low, high = np.flatnonzero(tally < epochs - blur), np.flatnonzero(tally > epochs + blur)
    for rows, what in ((low, f"fewer than {epochs - blur}"), (high, f"more than {epochs + blur}")):
        if len(rows):
            problems.append(f"{len(rows)} rows read {what} times in {epochs} epochs, e.g. {rs.ids[rows[0]].decode()}")
    if int(tally.sum()) != epochs * len(rs):
        problems.append(f"{int(tally.sum())} samples verified in {epochs} epochs of {len(rs)} rows")
    return problems


def _label(out: tuple[Any, ...], i: int) -> tuple[str, int, str | None]:
    return "", int(np.asarray(out[1].at(i)).ravel()[0]), None


def crs4_epochs(
    settings: CassandraSettings, rs: ReadSet, spec: PipelineSpec, preset: Crs4Preset, epochs: int = 1
) -> list[RunResult]:
    """EPOCHS epochs in a row of the plugin's reader with PRESET over RS (one pipeline, as a training run has),
    each verified by content (see ContentVerifier). RS's row count should be a multiple of the batch size: the
    plugin pads an epoch's last batch with copies of its last row, which an out-of-order reader may return
    anywhere in the batch."""
    args = crs4_reader_args(settings, rs.table or rs.location, [i.decode() for i in rs.ids], preset)
    pipe = crs4_pipeline(spec, args)
    knobs = {"reader": "fn.crs4.cassandra (cassandra-dali-plugin 1.3.2)", "preset": preset.name, **preset.knobs()}
    by_sha, tally = content_index(rs), np.zeros(len(rs), np.int32)
    results = []
    for _ in range(epochs):
        verifier = ContentVerifier(rs, by_sha, tally, strict=not preset.ooo)
        kw: dict[str, Any] = {"verify_after": spec.verify_after, "verifier": verifier}
        results.append(measure(f"crs4-plugin-{preset.name}", pipe, spec.mode, rs, _label, len(rs), dict(knobs), **kw))
    if preset.ooo:
        last = results[-1]
        ahead = (preset.prefetch_buffers + spec.prefetch_queue_depth) * spec.batch_size
        last.problems += check_tally(rs, tally, epochs, blur=max(1, -(-ahead // len(rs))))
        last.ok = not last.problems
        for r in results:
            r.settings["verified"] = "bytes and label of every sample; every row once per run of epochs (ooo)"
    return results
