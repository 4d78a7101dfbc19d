"""The cassandra-dali-plugin peer (crs4): its DALI operator ``fn.crs4.cassandra``, built by ``make install-peers``.

The plugin ships ``crs4.cassandra_utils`` and, beside the ``crs4`` folder in site-packages, the DALI plugin
library ``libcrs4cassandra.so`` (its example scripts locate it the same way). ``scripts/build_crs4_plugin.sh``
builds both from the plugin's sdist.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from imgest.core.errors import ConfigError

INSTALL_HINT = "run 'make install-peers' (builds cassandra-dali-plugin 1.3.2 into .venv; docs/crs4-plugin.md)"


def plugin_path() -> Path:
    """Where ``libcrs4cassandra.so`` is: beside the installed ``crs4`` package, as the plugin's scripts expect."""
    try:
        spec = importlib.util.find_spec("crs4.cassandra_utils")
    except ModuleNotFoundError:  # no crs4 package at all: find_spec imports the parent first
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"cassandra-dali-plugin is not installed (no crs4.cassandra_utils): {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))).parent.parent / "libcrs4cassandra.so"
    if not path.is_file():
        raise ConfigError(f"cassandra-dali-plugin's library {path} is missing: {INSTALL_HINT}")
    return path


def available() -> bool:
    """True when the plugin is installed (its library and helpers are there)."""
    try:
        plugin_path()
    except ConfigError:
        return False
    return True


@functools.cache
def load_plugin() -> Path:
    """Load ``fn.crs4.cassandra`` into DALI (once per process); return the library's path."""
    from nvidia.dali import plugin_manager

    path = plugin_path()
    plugin_manager.load_library(str(path))
    return path
