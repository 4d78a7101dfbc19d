"""Registered datasets: the datasets file the `refresh_<name>` DAGs are made from.

TOML, at ``$IMGEST_DATASETS_FILE`` (default ``$IMGEST_HOME/datasets.toml``). One table per dataset; its keys
are the trigger form's field names (``source``, ``layout``, ``image_mode``, ``resize``, ``keyspace``,
``s3_dest``, ``shard_max_count``, ``split_ratios``, ...) plus ``schedule`` and ``targets``::

    [datasets.flowers]
    source = "/data/flowers"
    layout = "imagefolder"
    targets = ["cassandra", "shards"]
    schedule = "@daily"          # a preset or a cron expression ("0 3 * * *")
    keyspace = "flowers"

Reading it does no I/O beyond the one file: no source folder is touched and no connection looked up, so
the DAG file parses fast. A malformed entry is reported with its name and field, and the others still load.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imgest.core import defaults
from imgest.core.errors import ConfigError
from imgest.core.paths import state_path

ENV = "IMGEST_DATASETS_FILE"
PRESETS = ("@once", "@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly", "@continuous")
OWN_KEYS = ("schedule", "targets", "target", "description")
REFRESH_TARGETS = ("cassandra", "shards")  # the targets an incremental refresh supports


def datasets_file() -> Path:
    """The datasets file: $IMGEST_DATASETS_FILE, else $IMGEST_HOME/datasets.toml."""
    return Path(os.environ.get(ENV) or state_path() / "datasets.toml").expanduser()


@dataclass(frozen=True)
class DatasetEntry:
    """One registered dataset: its schedule, targets and the ingest settings every refresh uses."""

    name: str
    schedule: str | None
    targets: tuple[str, ...]
    settings: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    def conf(self, target: str) -> dict[str, Any]:
        """The ingest request (the trigger form's conf) of this dataset for TARGET."""
        return {**self.settings, "dataset": self.name, "target": target}


@dataclass
class Registry:
    """What the datasets file holds: the valid entries, and one message per malformed entry."""

    path: Path
    entries: list[DatasetEntry] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def entry(self, name: str) -> DatasetEntry:
        for e in self.entries:
            if e.name == name:
                return e
        problem = next((m for m in self.errors if f"[datasets.{name}]" in m), "")
        raise ConfigError(problem or f"dataset {name!r} is not registered in {self.path}")


def load_registry(path: Path | None = None) -> Registry:
    """Read the datasets file (a missing file is an empty registry); malformed entries go to ``errors``."""
    path = path or datasets_file()
    registry = Registry(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return registry
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        registry.errors.append(f"{path}: cannot be read as TOML: {exc}")
        return registry
    unknown = sorted(set(data) - {"datasets"})
    if unknown:
        registry.errors.append(
            f"{path}: unknown top-level key(s) {', '.join(unknown)}; entries go under [datasets.<name>]"
        )
    tables = data.get("datasets", {})
    if not isinstance(tables, dict):
        registry.errors.append(f"{path}: 'datasets' must be a table of [datasets.<name>] entries")
        return registry
    for name, body in tables.items():
        try:
            registry.entries.append(parse_entry(name, body))
        except ConfigError as exc:
            registry.errors.append(f"{path} [datasets.{name}]: {exc}")
    return registry


def parse_entry(name: str, body: Any) -> DatasetEntry:
    """Validate one entry with the same rules as the trigger form; ConfigError names every bad field."""
    from imgest.flow.request import IngestRequest

    if not isinstance(body, dict):
        raise ConfigError("must be a table of settings")
    if "dataset" in body:
        raise ConfigError("field 'dataset': the entry's name is the dataset name; remove the field")
    problems: list[str] = []
    targets: tuple[str, ...] = ()
    schedule: str | None = None
    try:
        targets = _targets(body)
    except ConfigError as exc:
        problems.append(str(exc))
    try:
        schedule = _schedule(body.get("schedule"))
    except ConfigError as exc:
        problems.append(str(exc))
    settings = {k: v for k, v in body.items() if k not in OWN_KEYS}
    problems += _type_problems(settings)
    for target in () if problems else targets:
        try:
            IngestRequest.from_conf({**settings, "dataset": name, "target": target})
        except ConfigError as exc:
            problems.append(str(exc).removeprefix("invalid ingest settings: "))
    if problems:
        raise ConfigError("; ".join(dict.fromkeys(problems)))
    return DatasetEntry(name, schedule, targets, settings, str(body.get("description", "")))


JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def _type_problems(settings: dict[str, Any]) -> list[str]:
    """Fields whose value has the wrong type (the form's Params check this; a TOML file needs it here)."""
    from imgest.flow.request_form import param_specs

    specs = param_specs()
    problems = []
    for key, value in settings.items():
        if key not in specs:
            problems.append(f"field {key!r} is unknown (the trigger form's field names, schedule, targets)")
            continue
        kinds = specs[key]["type"]
        kinds = [kinds] if isinstance(kinds, str) else kinds
        allowed = tuple(t for k in kinds for t in JSON_TYPES.get(k, ()))
        wrong_bool = isinstance(value, bool) and bool not in allowed
        if not isinstance(value, allowed) or wrong_bool:
            problems.append(f"field {key!r} {value!r}: must be {' or '.join(kinds)}")
    return problems


def _targets(body: dict[str, Any]) -> tuple[str, ...]:
    raw = body.get("targets", body.get("target", defaults.TARGET))
    targets = (raw,) if isinstance(raw, str) else tuple(raw) if isinstance(raw, list) else ()
    if not targets or any(t not in REFRESH_TARGETS for t in targets) or len(set(targets)) != len(targets):
        raise ConfigError(f"field 'targets' {raw!r}: a list of distinct targets among {', '.join(REFRESH_TARGETS)}")
    return targets


def _schedule(value: Any) -> str | None:
    """None (manual only), a preset or a cron expression."""
    if value is None or value == "none":
        return None
    if not isinstance(value, str):
        raise ConfigError(f"field 'schedule' {value!r}: a preset ({', '.join(PRESETS)}), a cron expression or 'none'")
    if value.startswith("@"):
        if value not in PRESETS:
            raise ConfigError(f"field 'schedule' {value!r}: unknown preset; one of {', '.join(PRESETS)}")
        return value
    from croniter import croniter

    if not croniter.is_valid(value):
        raise ConfigError(f"field 'schedule' {value!r}: not a cron expression (minute hour day month weekday)")
    return value
