"""Schema rendering: identifiers are validated, replication is parsed, both table layouts are named right."""

from __future__ import annotations

import pytest

from imgest.core.errors import ConfigError
from imgest.sinks.cassandra.schema import TableLayout, identifier, replication, schema_statements


@pytest.mark.parametrize("bad", ["", "1abc", "a b", "x; DROP KEYSPACE y", "ks.t", "a" * 49, "naïve"])
def test_unsafe_identifiers_are_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match="not a valid name"):
        identifier(bad, "keyspace")


def test_replication_strategies() -> None:
    assert replication("SimpleStrategy:3") == "{'class': 'SimpleStrategy', 'replication_factor': 3}"
    assert replication("NetworkTopologyStrategy:dc1=3,dc-2=2") == (
        "{'class': 'NetworkTopologyStrategy', 'dc1': 3, 'dc-2': 2}"
    )
    for bad in ("SimpleStrategy:0", "Simple:1", "NetworkTopologyStrategy:", "NetworkTopologyStrategy:dc'=1"):
        with pytest.raises(ConfigError, match="not understood"):
            replication(bad)


def test_table_names_for_both_layouts() -> None:
    assert TableLayout("inet").tables(["train", "val"]) == {
        "train": {"data": "inet.data", "metadata": "inet.metadata"},
        "val": {"data": "inet.data", "metadata": "inet.metadata"},
    }
    per_split = TableLayout("inet", "per-split", "_orig")
    assert per_split.data_table("train") == "data_train_orig"
    assert per_split.metadata_table("val") == "metadata_val_orig"
    with pytest.raises(ConfigError):
        TableLayout("inet", "per-split", "_x;y")
    with pytest.raises(ConfigError):
        TableLayout("inet", "sideways")


def test_statements_create_plugin_compatible_data_table() -> None:
    statements = schema_statements(TableLayout("inet"), ["train", "val"], "SimpleStrategy:1")
    assert statements[0].startswith("CREATE KEYSPACE IF NOT EXISTS inet")
    data = [s for s in statements if "inet.data (" in s]
    assert len(data) == 1  # split-column layout: one data table shared by the splits
    assert "id uuid PRIMARY KEY" in data[0]
    assert "label int" in data[0]
    assert "data blob" in data[0]
    assert any("inet.dataset_versions" in s for s in statements)
    assert any("inet.quarantine" in s for s in statements)
