"""The names of the bulk helper's class-data archives: the install's training archive
(imgest.sinks.cassandra.bulk_archive) and the archive of each real run's mode, dumped by the first helper of that
mode on the host (bulk_helper.cds_options). imgest.core.jvmcds maps, dumps and adopts them."""

from __future__ import annotations

import hashlib
from pathlib import Path

JAR = "helper.jar"  # the compiled helper (a class-data archive cannot name a folder on its class path)

ARCHIVE_FAMILY = "bulk-helper-"  # the start of every helper build's archive name (jvmcds.prune_family)


def archive_name(home: Path) -> str:
    """The archive's name: the helper's key and where its jar is (an archive only maps the class path it was
    written for; a rebuilt or moved helper gets a new one)."""
    jar = (home / JAR).stat()
    where = hashlib.sha256(f"{home.resolve()}:{jar.st_size}:{jar.st_mtime_ns}".encode()).hexdigest()[:8]
    return f"{ARCHIVE_FAMILY}{home.name}-{where}"


def run_archive_name(home: Path, run: str) -> str:
    """The archive a real run of mode RUN dumps (cds_options). Its name does not start with archive_name(home)
    followed by '-', so that adopting either never removes the other as an archive of another key."""
    return f"{ARCHIVE_FAMILY}{run}-{archive_name(home).removeprefix(ARCHIVE_FAMILY)}"
