"""The cluster path's pure parts: worker environments, master commands, what travels with a submission."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from imgest.core.errors import ConfigError
from imgest.core.settings import CassandraSettings, S3Settings
from imgest.services.spark_cluster import SparkCluster
from imgest.spark.conf import on_loopback
from imgest.spark.submit import submit_command


def test_workers_start_with_nothing_of_the_callers_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("IMGEST_CASSANDRA_PASSWORD", "AWS_SECRET_ACCESS_KEY", "PYSPARK_PYTHON"):
        monkeypatch.setenv(name, "leak")
    cluster = SparkCluster(home=tmp_path, workers=2)
    envs = [cluster.worker_env(i) for i in (1, 2)]
    for env in envs:
        assert not [k for k in env if k.startswith(("IMGEST_", "AWS_", "PYSPARK_"))]
        assert "leak" not in env.values()
    assert envs[0]["SPARK_LOCAL_DIRS"] != envs[1]["SPARK_LOCAL_DIRS"]  # scratch of its own
    assert (
        cluster.worker_command(1)[cluster.worker_command(1).index("--work-dir") + 1]
        != cluster.worker_command(2)[cluster.worker_command(2).index("--work-dir") + 1]
    )
    assert cluster.worker_command(1)[:4][-2:] == [cluster.master_url, "--host"]


def test_loopback_masters_and_what_is_shipped() -> None:
    assert on_loopback("local[2]")
    assert on_loopback("spark://127.0.0.1:7077")
    assert not on_loopback("spark://10.0.0.5:7077")
    local = submit_command("pack_shards", ["--manifest-dir", "x"], "local[2]")
    remote = submit_command("pack_shards", ["--manifest-dir", "x"], "spark://10.0.0.5:7077")
    assert "--py-files" not in local
    assert remote[remote.index("--py-files") + 1].endswith("imgest-pyfiles.zip")


def test_connection_travels_pickled_with_the_ca_text_and_no_secret_in_repr(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nabc\n-----END CERTIFICATE-----\n")
    settings = CassandraSettings(
        hosts=("10.0.0.5",), username="u", password="s3cr3t-pw", ssl_ca_file=str(ca), local_dc="dc2"
    ).shippable()
    back = pickle.loads(pickle.dumps(settings))
    assert back == settings
    assert back.ssl_ca_data == ca.read_text()
    assert "s3cr3t-pw" not in repr(back)
    assert "BEGIN" not in repr(back)
    s3 = S3Settings(access_key="AKIAXX", secret_key="very-secret")
    assert "very-secret" not in repr(s3)
    assert "AKIAXX" not in repr(s3)


def test_missing_ca_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"ca\.pem.*--ssl-ca"):
        CassandraSettings(hosts=("10.0.0.5",), ssl_ca_file=str(tmp_path / "ca.pem")).shippable()


def test_ingest_config_prefers_the_shipped_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    from imgest.sinks.cassandra.ingest import CassandraIngestConfig
    from imgest.sinks.cassandra.schema import TableLayout
    from imgest.transform.image import TransformSpec

    monkeypatch.setenv("IMGEST_CASSANDRA_PASSWORD", "from-env")
    conn = CassandraSettings(hosts=("10.0.0.5",), username="u", password="shipped", protocol_version=5, local_dc="dc1")
    cfg = CassandraIngestConfig("r", "d", "v", TableLayout(), TransformSpec(), hosts=("h1",), consistency="ONE")
    cfg_shipped = CassandraIngestConfig(**{**cfg.__dict__, "connection": conn})
    assert cfg.settings().password == "from-env"  # no connection: the executor's environment
    got = cfg_shipped.settings()
    assert (got.password, got.protocol_version, got.local_dc, got.hosts, got.consistency) == (
        "shipped",
        5,
        "dc1",
        ("h1",),
        "ONE",
    )
