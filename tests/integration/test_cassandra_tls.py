"""Connection settings end to end against a real TLS-only Cassandra node whose CA is made at its start and which
requires a client certificate signed by it (mutual TLS): TLS (CA, client certificate and key as files or as shipped
texts), native protocol version, local DC and consistency, from the CLI flags through a Spark job on the standalone
cluster to its executors (the Python driver and the Java helpers) and to verify's reads."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from imgest.cli import main
from imgest.core.settings import CassandraSettings
from imgest.services.cassandra import CassandraServer
from imgest.services.spark_cluster import SparkCluster
from imgest.sinks.cassandra.client import CassandraConnectError, cassandra_session
from imgest.sources.devdata.sample import SampleSpec, write_sample

pytestmark = [pytest.mark.services, pytest.mark.slow]


def _settings(server: CassandraServer) -> CassandraSettings:
    assert server.client_files is not None
    cert, key = server.client_files
    return CassandraSettings(
        hosts=(server.host,),
        port=server.native_port,
        ssl_ca_file=str(server.ca_file),
        ssl_cert_file=str(cert),
        ssl_key_file=str(key),
        connect_timeout=5,
    )


def test_tls_node_refuses_plain_untrusted_and_clients_without_a_certificate(
    cassandra_tls_server: CassandraServer, tmp_path: Path
) -> None:
    from imgest.services.tls import make_server_tls

    plain = CassandraSettings(
        hosts=(cassandra_tls_server.host,), port=cassandra_tls_server.native_port, connect_timeout=5
    )
    with pytest.raises(CassandraConnectError), cassandra_session(plain):
        pass
    other = make_server_tls(tmp_path / "other-ca", "127.0.0.1")  # a CA that signed neither the node nor us
    with pytest.raises(CassandraConnectError), cassandra_session(replace(plain, ssl_ca_file=str(other.ca_pem))):
        pass
    good = _settings(cassandra_tls_server)
    no_certificate = replace(good, ssl_cert_file=None, ssl_key_file=None)
    with pytest.raises(CassandraConnectError), cassandra_session(no_certificate):
        pass  # the node requires a client certificate
    foreign = replace(good, ssl_cert_file=str(other.client_cert), ssl_key_file=str(other.client_key))
    with pytest.raises(CassandraConnectError), cassandra_session(foreign):
        pass  # one the node's CA did not sign
    with cassandra_session(good) as session:
        assert session.execute("SELECT release_version FROM system.local").one()[0].startswith("5.")


def test_the_client_certificate_travels_as_text(cassandra_tls_server: CassandraServer) -> None:
    """What a driver ships: the CA, the certificate and the key (turned into PKCS#8) as texts; an executor with none
    of the files connects with them alone."""
    shipped = _settings(cassandra_tls_server).shippable()
    assert (shipped.ssl_cert_data or "").startswith("-----BEGIN CERTIFICATE-----")
    assert (shipped.ssl_key_data or "").startswith("-----BEGIN PRIVATE KEY-----")  # was SEC1 on disk
    assert "KEY" not in repr(shipped)
    elsewhere = replace(shipped, ssl_ca_file=None, ssl_cert_file=None, ssl_key_file=None)
    with cassandra_session(elsewhere) as session:
        assert session.execute("SELECT release_version FROM system.local").one()[0].startswith("5.")


@pytest.mark.parametrize("protocol", [4, 5])
def test_ca_text_protocol_and_local_dc_reach_the_driver(cassandra_tls_server: CassandraServer, protocol: int) -> None:
    shipped = replace(_settings(cassandra_tls_server), protocol_version=protocol, local_dc="datacenter1").shippable()
    assert (shipped.ssl_ca_data or "").startswith("-----BEGIN CERTIFICATE-----")
    executor_side = replace(
        shipped, ssl_ca_file="/nowhere/ca.pem", ssl_cert_file="/nowhere/c.pem", ssl_key_file="/nowhere/k.pem"
    )
    with cassandra_session(executor_side) as session:
        row = session.execute("SELECT data_center FROM system.local").one()
        assert session.cluster.protocol_version == protocol
        assert session.cluster.profile_manager.default.load_balancing_policy._child_policy.local_dc == row.data_center
    assert row.data_center == "datacenter1"


@pytest.mark.parametrize("path", ["cql", "bulk", "cql-helper"])
def test_ingest_over_tls_on_the_cluster(
    tmp_path: Path,
    cassandra_tls_server: CassandraServer,
    spark_cluster: SparkCluster,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
) -> None:
    """bulk: Spark ships the helper to the standalone cluster's executors (SparkFiles), which read the ring over
    TLS with the CA text shipped in the task and stream to the node's storage port. cql-helper: the shipped helper's
    Java driver sends the rows over TLS, trusting the same CA text, to the named local data centre."""
    monkeypatch.setenv("IMGEST_STATE_URL", "local")  # the suite's cluster runs on this machine: one disk
    ks = f"imgest_test_tls_{path.replace('-', '_')}"
    with cassandra_session(_settings(cassandra_tls_server)) as session:
        session.execute(f"DROP KEYSPACE IF EXISTS {ks}", timeout=60)
    write_sample(tmp_path / "src", SampleSpec("cls-loc", classes=2, per_class=5, val_per_class=2, seed=3))
    work = tmp_path / "work"
    argv = ["ingest", "cassandra", str(tmp_path / "src"), "--work-dir", str(work), "--keyspace", ks]
    argv += ["--master", spark_cluster.master_url, "--port", str(cassandra_tls_server.native_port)]
    argv += ["--ssl-ca", str(cassandra_tls_server.ca_file), "--protocol-version", "5", "--local-dc", "datacenter1"]
    assert cassandra_tls_server.client_files is not None
    argv += [
        "--ssl-cert",
        str(cassandra_tls_server.client_files[0]),
        "--ssl-key",
        str(cassandra_tls_server.client_files[1]),
    ]
    argv += ["--consistency", "ONE", "--verify", "--write-path", path]
    assert main(argv) == 0
    summary = json.loads((work / "ingest_cassandra.json").read_text())
    assert summary["stored"] == 2 * 5 + 2 * 2
    assert summary["write_path"]["path"] == path
    with cassandra_session(_settings(cassandra_tls_server)) as session:
        assert session.execute(f"SELECT count(*) FROM {ks}.data").one()[0] == 14
        status = session.execute(f"SELECT status FROM {ks}.dataset_versions").one().status
    assert status == "complete"  # verify read every row back over TLS and marked the version


def _one_row(helper: Any, row: Any) -> int:
    helper.add(0, [row.bytes])
    helper.start_load()
    return int(helper.wait_load())


def test_the_helpers_driver_checks_that_the_certificate_names_the_node(cassandra_tls_server: CassandraServer) -> None:
    """cql-helper's Java driver trusts the shipped CA and, as the Python driver does, checks that the node's
    certificate names the address it was reached at: 127.0.0.1 (in the certificate) writes, localhost does not."""
    import uuid

    from imgest.sinks.cassandra.bulk_helper import BulkHelper, BulkLoadError, ensure_helper
    from imgest.sinks.cassandra.bulk_writer import BulkTarget

    ks = "imgest_test_tls_helper"
    settings = replace(_settings(cassandra_tls_server), consistency="ONE").shippable()
    with cassandra_session(settings) as session:
        session.execute(f"DROP KEYSPACE IF EXISTS {ks}", timeout=60)
        session.execute(
            f"CREATE KEYSPACE {ks} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}"
        )
        session.execute(f"CREATE TABLE {ks}.t (id uuid PRIMARY KEY)")
    insert = (("t", "", f"INSERT INTO {ks}.t (id) VALUES (?)"),)
    target = BulkTarget(helper="", keyspace=ks, partitioner="", tables=insert, storage_port=0, mode="cql")
    row = uuid.uuid4()
    for host, ok in (("127.0.0.1", True), ("localhost", False)):
        helper = BulkHelper(ensure_helper(), target.header(replace(settings, hosts=(host,))))
        try:
            if ok:
                assert _one_row(helper, row) == 1
                assert helper.refused == []
            else:  # the same node at the same address (localhost/127.0.0.1), by a name its certificate lacks
                with pytest.raises(BulkLoadError, match=r"All host\(s\) tried .*localhost/127\.0\.0\.1"):
                    _one_row(helper, row)
        finally:
            helper.close()
    with cassandra_session(settings) as session:
        assert [r.id for r in session.execute(f"SELECT id FROM {ks}.t")] == [row]
