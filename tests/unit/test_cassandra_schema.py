"""Schema rendering: identifiers are validated, replication is parsed, both table layouts are named right."""

from __future__ import annotations

import pytest

from imgest.core.errors import ConfigError
from imgest.sinks.cassandra.schema import TableLayout, identifier, replication, schema_statements


@pytest.mark.parametrize("bad", ["", "1abc", "a b", "x; DROP KEYSPACE y", "ks.t", "naïve"])
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


@pytest.mark.parametrize("word", ["select", "table", "keyspace", "with", "token"])
def test_reserved_words_are_refused_with_the_reason(word: str) -> None:
    with pytest.raises(ConfigError, match=f"keyspace '{word}' is a reserved CQL word"):
        TableLayout(word)


def test_mixed_case_is_refused_not_folded() -> None:
    with pytest.raises(ConfigError, match="'Adva' holds upper-case letters: Cassandra folds unquoted names to 'adva'"):
        TableLayout("Adva")
    with pytest.raises(ConfigError, match="table suffix '_Orig' holds upper-case letters"):
        TableLayout("adva", "per-split", "_Orig")


def test_too_long_names_are_refused_for_their_length() -> None:
    with pytest.raises(ConfigError, match="table suffix '_aaaaaaaaaaaaaaaaaaaaaaaa' is 25 characters long; at most 20"):
        TableLayout("inet", "per-split", "_" + "a" * 24)
    with pytest.raises(ConfigError, match="is 49 characters long; Cassandra allows at most 48"):
        identifier("a" * 49, "keyspace")


def test_shard_destinations_are_checked_before_use() -> None:
    from imgest.sinks.shards.store import dest_problem, open_store

    assert dest_problem("s3://imgest/inet/v1") is None
    assert dest_problem("/data/shards") is None
    for bad, why in [
        ("s3://imgest/../../etc", "'..' segments"),
        ("s3://imgest/a//b", "empty"),
        ("s3://imgest/./x", "'.'"),
        ("s3://Bad_Bucket/x", "not an S3 bucket name"),
        ("s3:///x", "not an S3 bucket name"),
        ("http://host/x", "only s3:// URLs"),
    ]:
        assert why in (dest_problem(bad) or ""), bad
        with pytest.raises(ConfigError, match="destination"):
            open_store(bad)
