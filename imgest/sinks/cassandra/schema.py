"""Cassandra schema: table naming for both layouts, validated identifiers, and the sql/*.cql files."""

from __future__ import annotations

import re
from dataclasses import dataclass
from string import Template
from typing import Any

from imgest.core import defaults
from imgest.core.errors import ConfigError
from imgest.core.paths import sql_dir

IDENTIFIER = re.compile(r"^[a-z][a-z0-9_]{0,47}$")
IDENTIFIER_MAX = 48
SUFFIX = re.compile(r"^[a-z0-9_]*$")
SUFFIX_MAX = 20
DC_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
TABLE_LAYOUTS = defaults.TABLE_LAYOUTS
# Cassandra 5.0's reserved words (org/apache/cassandra/cql3/reserved_keywords.txt): never valid unquoted names.
RESERVED = frozenset(
    [
        "add",
        "allow",
        "alter",
        "and",
        "apply",
        "asc",
        "authorize",
        "batch",
        "begin",
        "by",
        "columnfamily",
        "create",
        "delete",
        "desc",
        "describe",
        "drop",
        "entries",
        "execute",
        "from",
        "full",
        "grant",
        "if",
        "in",
        "index",
        "infinity",
        "insert",
        "into",
        "is",
        "keyspace",
        "limit",
        "materialized",
        "modify",
        "nan",
        "norecursive",
        "not",
        "null",
        "of",
        "on",
        "or",
        "order",
        "primary",
        "rename",
        "revoke",
        "schema",
        "select",
        "set",
        "table",
        "to",
        "token",
        "truncate",
        "unlogged",
        "update",
        "use",
        "using",
        "view",
        "where",
        "with",
    ]
)


def identifier(name: str, what: str) -> str:
    """NAME if it is a safe unquoted CQL identifier, else a ConfigError naming WHAT and why.

    imgest never quotes names, so it refuses what Cassandra would fold or reject: upper case (folded to lower
    case unquoted), reserved words, names over 48 characters, and anything but letters, digits and _.
    """
    name = name or ""
    if len(name) > IDENTIFIER_MAX:
        raise ConfigError(f"{what} {name!r} is {len(name)} characters long; Cassandra allows at most {IDENTIFIER_MAX}")
    if not IDENTIFIER.match(name.lower()):
        raise ConfigError(f"{what} {name!r} is not a valid name: use letters, digits and _, start with a letter")
    if name != name.lower():
        raise ConfigError(
            f"{what} {name!r} holds upper-case letters: Cassandra folds unquoted names to {name.lower()!r} and imgest "
            f"does not quote names; use {name.lower()!r}"
        )
    if name in RESERVED:
        raise ConfigError(f"{what} {name!r} is a reserved CQL word; choose another name, e.g. {name + '_ds'!r}")
    return name


def table_suffix(suffix: str) -> str:
    """SUFFIX if it can end a table name (at most 20 lower-case letters, digits or _), else a ConfigError."""
    if len(suffix) > SUFFIX_MAX:
        raise ConfigError(f"table suffix {suffix!r} is {len(suffix)} characters long; at most {SUFFIX_MAX}")
    if not SUFFIX.match(suffix.lower()):
        raise ConfigError(f"table suffix {suffix!r} may only hold letters, digits and _")
    if suffix != suffix.lower():
        raise ConfigError(
            f"table suffix {suffix!r} holds upper-case letters: Cassandra folds unquoted names to lower case; "
            f"use {suffix.lower()!r}"
        )
    return suffix


def replication(spec: str) -> str:
    """CQL replication map from 'SimpleStrategy:3' or 'NetworkTopologyStrategy:dc1=3,dc2=2'."""
    strategy, _, params = spec.partition(":")
    try:
        if strategy == "SimpleStrategy":
            factor = int(params or "1")
            if factor < 1:
                raise ValueError
            return f"{{'class': 'SimpleStrategy', 'replication_factor': {factor}}}"
        if strategy == "NetworkTopologyStrategy" and params:
            pairs = [p.split("=") for p in params.split(",")]
            if any(len(p) != 2 or not DC_NAME.match(p[0]) or int(p[1]) < 1 for p in pairs):
                raise ValueError
            dcs = ", ".join(f"'{dc}': {int(n)}" for dc, n in pairs)
            return f"{{'class': 'NetworkTopologyStrategy', {dcs}}}"
    except ValueError:
        pass
    raise ConfigError(
        f"replication {spec!r} is not understood; use SimpleStrategy:N or NetworkTopologyStrategy:dc1=N[,dc2=M]"
    )


@dataclass(frozen=True)
class TableLayout:
    """Where a dataset's rows live. split-column: data{suffix} + metadata{suffix} with a split column;
    per-split: data_{split}{suffix} + metadata_{split}{suffix}."""

    keyspace: str = defaults.KEYSPACE
    layout: str = defaults.TABLE_LAYOUT
    suffix: str = defaults.TABLE_SUFFIX

    def __post_init__(self) -> None:
        identifier(self.keyspace, "keyspace")
        if self.layout not in TABLE_LAYOUTS:
            raise ConfigError(f"table layout {self.layout!r} is not one of {', '.join(TABLE_LAYOUTS)}")
        table_suffix(self.suffix)

    def data_table(self, split: str) -> str:
        return identifier(self._name("data", split), "data table")

    def metadata_table(self, split: str) -> str:
        return identifier(self._name("metadata", split), "metadata table")

    def _name(self, kind: str, split: str) -> str:
        return f"{kind}_{split}{self.suffix}" if self.layout == "per-split" else f"{kind}{self.suffix}"

    def tables(self, splits: list[str]) -> dict[str, dict[str, str]]:
        """split -> {'data': 'ks.table', 'metadata': 'ks.table'}."""
        return {
            s: {
                "data": f"{self.keyspace}.{self.data_table(s)}",
                "metadata": f"{self.keyspace}.{self.metadata_table(s)}",
            }
            for s in splits
        }


def render(name: str, **values: str) -> list[str]:
    """Statements of sql/NAME.cql with VALUES substituted (callers pass validated identifiers only)."""
    text = Template((sql_dir() / f"{name}.cql").read_text()).substitute(values)
    body = "\n".join(line for line in text.splitlines() if not line.strip().startswith("--"))
    return [stmt.strip() for stmt in body.split(";") if stmt.strip()]


def schema_statements(tables: TableLayout, splits: list[str], replication_spec: str) -> list[str]:
    """Every CREATE statement the dataset needs, in order."""
    ks = tables.keyspace
    statements = render("keyspace", keyspace=ks, replication=replication(replication_spec))
    for split in sorted({s for s in splits}):
        statements += render("data_table", keyspace=ks, table=tables.data_table(split))
        statements += render("metadata_table", keyspace=ks, table=tables.metadata_table(split))
    statements += render("versions_table", keyspace=ks)
    statements += render("quarantine_table", keyspace=ks)
    return list(dict.fromkeys(statements))  # split-column layout repeats the same tables


def apply_schema(session: Any, tables: TableLayout, splits: list[str], replication_spec: str) -> list[str]:
    """Create the keyspace and tables if missing (idempotent); returns the statements run."""
    statements = schema_statements(tables, splits, replication_spec)
    for stmt in statements:
        session.execute(stmt, timeout=60)
    ks = tables.keyspace
    add_column(session, f"{ks}.dataset_versions", "checks", "map<text, text>")
    add_column(session, f"{ks}.dataset_versions", "changes", "map<text, int>")  # a refresh's counts
    add_column(session, f"{ks}.dataset_versions", "lineage", "list<text>")  # a refreshed version's members
    add_column(session, f"{ks}.dataset_versions", "writer", "text")  # the lock holder that claimed the version
    for table in sorted({tables.metadata_table(s) for s in splits}):  # tables created before the columns existed
        add_column(session, f"{ks}.{table}", "dataset", "text")
        add_column(session, f"{ks}.{table}", "version", "text")
    return statements


def add_column(session: Any, table: str, column: str, cql_type: str) -> None:
    """Add COLUMN to TABLE if it is missing (tables created by an older imgest)."""
    from cassandra import InvalidRequest

    try:
        session.execute(f"ALTER TABLE {table} ADD {column} {cql_type}", timeout=60)
    except InvalidRequest as exc:
        if "conflicts with an existing column" not in str(exc) and "already exists" not in str(exc):
            raise
