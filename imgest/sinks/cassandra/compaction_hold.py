"""Background compaction held off on a bulk load's tables while it streams, given back when it ends.

Every SSTable a helper streams spans the whole token range, so size-tiered compaction merges them four at a time
while the load still runs, on the cores the transform needs. A bulk load therefore sets ``'enabled': 'false'`` in
the compaction options of the tables it loads (a schema change every node applies; no JMX needed) and puts them back
when it ends, failed or not, before the version is recorded. Given back by a schema change, compaction starts at the
node's next background check (within about a minute) and merges the loaded SSTables at once.

The table's comment carries a mark: who holds it (``<dataset>/<version>``), since when, and the comment it had.
Holding is best effort (a role that may not alter the table, a timeout: the load runs with compaction on, as
before). A load gives back only a hold that still names its own dataset: a bulk load of another dataset into the
same tables that started meanwhile has taken the hold over and gives it back when it ends. A load killed outright
cannot give it back; the next ingest of the same dataset does, at its start (it holds the dataset's lock, so the
holder is gone). To give it back by hand: ``ALTER TABLE ks.t WITH compaction = {...}`` with the options less
``'enabled'``, and the comment after ``comment before:``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

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


def holder_of(comment: str) -> str | None:
    """The ``dataset/version`` a marked COMMENT names; None if it carries no mark."""
    if not comment.startswith(MARK + " by "):
        return None
    return comment[len(MARK) + 4 :].split(" since ", 1)[0]


def hold(session: Any, tables: Iterable[str], holder: str) -> list[str]:
    """Turn background compaction off on TABLES ('ks.table'), marking each with HOLDER (``dataset/version``);
    returns the tables held. A table whose compaction was already off without a mark (the operator's choice) is
    left alone, and so is one that cannot be altered (no ALTER permission, a timeout): logged, not raised."""
    held = []
    for table in sorted(set(tables)):
        try:
            options, comment = _options(session, table)
            marked = holder_of(comment) is not None
            if options.get("enabled", "true").lower() == "false" and not marked:
                log.info("%s: compaction is off already (not by imgest); left as it is", table)
                continue
            before = comment.split(WAS, 1)[1] if marked and WAS in comment else ("" if marked else comment)
            note = f"{MARK} by {holder} since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
            _alter(session, table, {**options, "enabled": "false"}, note + (WAS + before if before else ""))
        except Exception as exc:  # an optimisation only: the load runs with compaction on
            log.warning("%s: compaction stays on during the load: %s", table, exc)
            continue
        held.append(table)
    if held:
        log.info("compaction held on %s while the load streams", ", ".join(held))
    return held


def release(session: Any, tables: Iterable[str], dataset: str) -> list[str]:
    """Give compaction back on those of TABLES whose mark names DATASET (this load's, or a killed load's of the same
    dataset); returns them. Tables that do not exist, carry no mark or another dataset's are left as they are, and a
    table that cannot be altered is logged, not raised."""
    released = []
    for table in sorted(set(tables)):
        try:
            options, comment = _options(session, table)
            holder = holder_of(comment)
            if holder is None or holder.rsplit("/", 1)[0] != dataset:
                if holder is not None:
                    log.info("%s: compaction is held by %s, which gives it back", table, holder)
                continue
            restored = {k: v for k, v in options.items() if k != "enabled"}
            _alter(session, table, restored, comment.split(WAS, 1)[1] if WAS in comment else "")
        except KeyError:
            continue
        except Exception as exc:  # the next ingest of this dataset tries again
            log.warning("%s: could not give compaction back: %s", table, exc)
            continue
        released.append(table)
    if released:
        log.info("compaction given back on %s; the nodes compact in the background", ", ".join(released))
    return released
