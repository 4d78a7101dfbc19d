"""The installed bulk-load helper trained: ``train_archive`` writes its class-data-sharing archive with a training run
that needs no cluster, so that every helper starts from the archive (about 1.7 CPU seconds instead of 2.5).
``imgest bulk-helper install`` runs it (imgest.sinks.cassandra.bulk_install). A job never trains: where the install
did not, the first helper on the host dumps the archive when it exits (imgest.core.jvmcds), and later ones map it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import struct
import subprocess
import tempfile
import time
from pathlib import Path

from imgest.core import jvmcds
from imgest.sinks.cassandra.bulk_helper import cds_options, java_command, row_frame
from imgest.sinks.cassandra.helper_cds import ARCHIVE_FAMILY, archive_name
from imgest.sinks.cassandra.ingest import META_COLUMNS
from imgest.sinks.cassandra.schema import TableLayout, render

log = logging.getLogger(__name__)


def train_archive(home: Path) -> Path | None:
    """Write HOME's class-data archive with a training run that needs no cluster: a few rows of the data and
    metadata tables become SSTables on local disk ('T'), then the helper quits and the JVM dumps the classes it
    loaded. Best effort: without the archive helpers start as before. Returns the archive, or None."""
    archive = jvmcds.archive_path(archive_name(home), home / "lib")
    flags, dump = cds_options(home)
    if dump is None:  # there is one already, or another process writes it now (or archives are off)
        if flags:
            jvmcds.prune_family(archive, ARCHIVE_FAMILY)
        return archive if flags else None
    layout, ks = TableLayout(keyspace="imgest_train"), "imgest_train"
    tables = []
    for kind, columns in (("data_table", ("id", "label", "data")), ("metadata_table", META_COLUMNS)):
        name = layout.data_table("train") if kind == "data_table" else layout.metadata_table("train")
        insert = f"INSERT INTO {ks}.{name} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
        tables.append({"name": name, "create": render(kind, keyspace=ks, table=name)[0], "insert": insert})
    loader = {"hosts": ["127.0.0.1"], "native_port": 9, "storage_port": 7000, "connections_per_host": 1, "ignore": []}
    scratch = Path(tempfile.mkdtemp(prefix="imgest-bulk-train-"))
    header = {"keyspace": ks, "partitioner": "org.apache.cassandra.dht.Murmur3Partitioner", "buffer_mib": 8}
    header |= {"storage_compatibility_mode": "CASSANDRA_4", "tables": tables, "loader": loader}
    body = json.dumps({**header, "dir": str(scratch / "sstables")}).encode()
    frames = [struct.pack(">I", len(body)) + body]
    for i in range(64):
        row_id = hashlib.md5(str(i).encode()).digest()
        frames.append(row_frame(0, [row_id, struct.pack(">i", i), os.urandom(40_000)]))
        meta: list[bytes | None] = [row_id, struct.pack(">i", i), *(b"x" for _ in META_COLUMNS[2:])]
        for at in (META_COLUMNS.index(c) for c in ("width", "height", "nbytes")):
            meta[at] = struct.pack(">i", 1)
        frames.append(row_frame(1, meta))
    cmd = java_command(home)
    cmd[1:1] = flags
    t0 = time.monotonic()
    proc: subprocess.Popen[bytes] | None = None
    try:
        with open(scratch / "helper.log", "wb") as err:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
            jvmcds.writer(dump, proc.pid)
            out, _ = proc.communicate(b"".join(frames) + b"TQ", timeout=300)
        if proc.returncode != 0 or not out.decode(errors="replace").startswith("OK 128"):
            tail = (scratch / "helper.log").read_text(errors="replace")[-1500:]
            log.warning("bulk-load helper: no class-data archive (training exit %s): %s", proc.returncode, tail)
            return None
    except (OSError, subprocess.TimeoutExpired) as exc:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        log.warning("bulk-load helper: no class-data archive (%s); helpers start without it", exc)
        return None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if jvmcds.adopt(archive):
        for gone in jvmcds.prune_family(archive, ARCHIVE_FAMILY):
            log.info("bulk-load helper: removed the class-data archive of an earlier helper build, %s", gone.name)
        log.info("bulk-load helper: class-data archive %s written in %.1f s", archive, time.monotonic() - t0)
        return archive
    return None
