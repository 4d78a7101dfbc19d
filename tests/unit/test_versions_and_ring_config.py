"""Version conflicts, the consistency setting and the ring's node configuration (no services needed)."""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import pytest
import yaml

from imgest.core.errors import ConfigError
from imgest.core.settings import CassandraSettings
from imgest.services.cassandra import CassandraServer
from imgest.services.ring import CassandraRing
from imgest.sinks.cassandra.versions import VersionRecord, conflicting
from imgest.spark.job_options import CASSANDRA_OPTIONS, add_options, forward

TABLES = {s: {"data": "ks.data", "metadata": "ks.metadata"} for s in ("train", "val")}


def _record(version: str, status: str, suffix: str = "") -> VersionRecord:
    tables = {s: {"data": f"ks.data{suffix}", "metadata": f"ks.metadata{suffix}"} for s in ("train", "val")}
    return VersionRecord("inet", version, status, tables, "{}", [])


def test_only_active_versions_in_the_same_tables_conflict() -> None:
    existing = [
        _record("t-aaa", "complete"),
        _record("t-bbb", "replaced"),
        _record("t-ccc", "written", suffix="_orig"),
        _record("t-new", "writing"),
    ]
    assert [r.version for r in conflicting(existing, "t-new", TABLES)] == ["t-aaa"]
    assert conflicting(existing, "t-aaa", TABLES) == [existing[3]]


def test_consistency_level_from_env_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert CassandraSettings(hosts=("10.0.0.5",)).consistency == "LOCAL_QUORUM"
    monkeypatch.setenv("IMGEST_CASSANDRA_CONSISTENCY", "quorum")
    assert CassandraSettings.from_env().consistency == "QUORUM"
    with pytest.raises(ConfigError, match="not one of"):
        CassandraSettings(hosts=("10.0.0.5",), consistency="MOST")


def test_job_options_forward_consistency_and_replace_flag() -> None:
    parser = argparse.ArgumentParser()
    add_options(parser, CASSANDRA_OPTIONS)
    ns = parser.parse_args(["--consistency", "all", "--replace-version"])
    argv = forward(ns, CASSANDRA_OPTIONS)
    assert argv[argv.index("--consistency") + 1] == "ALL"
    assert "--replace-version" in argv
    assert argv[argv.index("--replace-version") + 1 :][:1] != ["True"]
    assert "--replace-version" not in forward(parser.parse_args([]), CASSANDRA_OPTIONS)


def test_ring_nodes_have_own_address_folders_and_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IMGEST_HOME", str(tmp_path))
    ring = CassandraRing.default()
    assert ring.hosts == ("127.0.0.2", "127.0.0.3", "127.0.0.4")
    assert len({n.home for n in ring.nodes}) == 3
    assert len({n.jmx_port for n in ring.nodes}) == 3
    for node in ring.nodes:
        conf = yaml.safe_load(node.render_config().read_text())
        assert conf["listen_address"] == conf["rpc_address"] == node.host
        assert conf["seed_provider"][0]["parameters"][0]["seeds"] == "127.0.0.2:7000"
        assert conf["cluster_name"] == "imgest-ring"
        assert conf["native_transport_port"] == 9042
        command = node.command("java", _fake_lib(tmp_path), node.home / "cassandra.yaml")
        assert "-Xmx1024M" in command
        assert "-XX:MaxDirectMemorySize=1024M" in command
        assert f"-Dcassandra.jmx.local.port={node.jmx_port}" in command
        assert f"-Dcassandra.storagedir={node.home / 'data'}" in command
        assert f"-XX:HeapDumpPath={node.home / 'logs'}" in command  # not the caller's folder


def test_ring_nodes_own_fixed_interleaved_tokens_and_skip_bootstrap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new ring's nodes join together: fixed tokens (16 each, evenly spread, interleaved), no bootstrap; the
    single embedded node keeps the token allocator."""
    monkeypatch.setenv("IMGEST_HOME", str(tmp_path))
    tokens: list[int] = []
    for node in CassandraRing.default().nodes:
        conf = yaml.safe_load(node.render_config().read_text())
        assert conf["auto_bootstrap"] is False
        assert "allocate_tokens_for_local_replication_factor" not in conf
        mine = [int(t) for t in conf["initial_token"].split(",")]
        assert len(mine) == conf["num_tokens"] == 16
        tokens += mine
    ordered = sorted(tokens)
    assert len(set(tokens)) == 48
    assert ordered[0] == -(2**63)
    gaps = {b - a for a, b in itertools.pairwise(ordered)}
    assert max(gaps) - min(gaps) <= 1  # 48 equal slices of the Murmur3 ring
    assert tokens[:3] != ordered[:3]  # node 1's first tokens are not its neighbours': interleaved
    single = yaml.safe_load(CassandraServer.default().render_config().read_text())
    assert single["allocate_tokens_for_local_replication_factor"] == 1
    assert "initial_token" not in single


def _fake_lib(tmp_path: Path) -> Path:
    lib = tmp_path / "lib"
    lib.mkdir(exist_ok=True)
    (lib / "jamm-0.4.0.jar").touch()
    return lib


def test_too_few_replicas_named_with_level_even_inside_no_host_available() -> None:
    from cassandra import ConsistencyLevel, Unavailable, WriteTimeout
    from cassandra.cluster import NoHostAvailable

    from imgest.sinks.cassandra.client import CassandraUnavailableError, explain_unavailable

    unavailable = Unavailable("x", consistency=ConsistencyLevel.QUORUM, required_replicas=2, alive_replicas=1)
    with (
        pytest.raises(CassandraUnavailableError, match="QUORUM needs 2 live replicas but only 1 is alive"),
        explain_unavailable(None),
    ):
        raise NoHostAvailable("all failed", {"127.0.0.2": unavailable})
    timeout = WriteTimeout(
        "x", consistency=ConsistencyLevel.ALL, required_responses=3, received_responses=2, write_type=0
    )
    with (
        pytest.raises(CassandraUnavailableError, match="ALL needs 3 replica answers but only 2 replicas answered"),
        explain_unavailable(None),
    ):
        raise timeout
    with pytest.raises(NoHostAvailable), explain_unavailable(None):  # anything else passes through unchanged
        raise NoHostAvailable("refused", {"127.0.0.2": ConnectionRefusedError()})
