"""Background compaction held off on a bulk load's tables while it streams, given back when it ends.

Every SSTable a helper streams spans the whole token range, so size-tiered compaction merges them four at a time
while the load still runs: at 1.33 M images the node rewrote 11.5 GB during the ingest, on the cores the
transform needs. A bulk load therefore sets ``'enabled': 'false'`` in the compaction options of the tables it
loads (a schema change every node applies; no JMX needed) and puts them back when it ends, failed or not, before
the version is recorded. The node then compacts in the background, as it does after any large write.

A load killed outright cannot give them back. The table's comment carries the mark (who held it, since when, and
the comment it had), and every ingest into the keyspace, bulk or CQL, gives back a held table it finds at its start,
so a dead load leaves compaction off only until the next ingest into those tables (``imgest ingest`` into the same
keyspace, or ``release`` below).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from cassandra import Unauthorized

log = logging.getLogger(__name__)
MARK = "imgest: compaction held during a bulk load"
WAS = " | comment before: "


def _options(session: Any, table: str) -> tuple[dict[str, str], str]:
    keyspace, name = table.split(".", 1)
    row = session.execute(
        "SELECT compaction, comment FROM system_schema.tables WHERE keyspace_name = %s AND table_name = %s",
        (keyspace, name),
    ).one()
    if row is None:
        raise KeyError(f"table {table} does not exist")
    return dict(row.compaction or {}), row.comment or ""


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _map(options: dict[str, str]) -> str:
    return "{" + ", ".join(f"{_literal(k)}: {_literal(str(v))}" for k, v in sorted(options.items())) + "}"


def _alter(session: Any, table: str, options: dict[str, str], comment: str) -> None:
    session.execute(
        f"ALTER TABLE {table} WITH compaction = {_map(options)} AND comment = {_literal(comment)}", timeout=60
    )


def hold(session: Any, tables: Iterable[str], holder: str) -> list[str]:
    """Turn background compaction off on TABLES ('ks.table'), marking each with HOLDER; returns the tables held.
    A table whose compaction was already off without our mark (the operator's choice) is left alone, and so is one
    this role may not alter (the load then runs with compaction on, as before)."""
    held = []
    for table in sorted(set(tables)):
        options, comment = _options(session, table)
        marked = comment.startswith(MARK)
        if options.get("enabled", "true").lower() == "false" and not marked:
            log.info("%s: compaction is off already (not by imgest); left as it is", table)
            continue
        before = comment.split(WAS, 1)[1] if marked and WAS in comment else ("" if marked else comment)
        note = f"{MARK} by {holder} since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
        try:
            _alter(session, table, {**options, "enabled": "false"}, note + (WAS + before if before else ""))
        except Unauthorized as exc:  # a role with MODIFY but not ALTER on tables an operator created
            log.warning("%s: compaction stays on during the load: this role may not alter the table (%s)", table, exc)
            continue
        held.append(table)
    if held:
        log.info("compaction held on %s while the load streams", ", ".join(held))
    return held


def release(session: Any, tables: Iterable[str]) -> list[str]:
    """Give compaction back on those of TABLES that carry the mark (ours, or a killed load's); returns them.
    Tables that do not exist yet are skipped."""
    released = []
    for table in sorted(set(tables)):
        try:
            options, comment = _options(session, table)
        except KeyError:
            continue
        if not comment.startswith(MARK):
            continue
        restored = {k: v for k, v in options.items() if k != "enabled"}
        _alter(session, table, restored, comment.split(WAS, 1)[1] if WAS in comment else "")
        released.append(table)
    if released:
        log.info("compaction given back on %s; the nodes compact in the background", ", ".join(released))
    return released
