"""docker/compose.yaml: valid for docker-compose (no engine needed), the topology the tests prove, the
same variable names, and Spark workers without credentials; the Dockerfile installs from the lock files."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from imgest.core.paths import repo_root

ROOT = repo_root()
pytestmark = pytest.mark.skipif(ROOT is None, reason="needs a source checkout")
SECRETS = ("AIRFLOW_DB_PASSWORD", "AIRFLOW_JWT_SECRET", "IMGEST_S3_ACCESS_KEY", "IMGEST_S3_SECRET_KEY")


def _config(tmp_path: Path) -> dict:
    compose = shutil.which("docker-compose")
    if compose is None:
        message = "docker-compose not installed (Debian: apt-get install docker-compose; scripts/install.sh --dev)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **{name: f"x-{name.lower()}" for name in SECRETS}}
    env["IMGEST_CASSANDRA_PASSWORD"] = "x-cassandra-password"
    cmd = [compose, "-f", str(ROOT / "docker" / "compose.yaml")]
    check = subprocess.run([*cmd, "config", "-q"], env=env, capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr
    out = subprocess.run([*cmd, "config"], env=env, capture_output=True, text=True, check=True).stdout
    return yaml.safe_load(out)


def test_compose_is_valid_and_has_the_tested_topology(tmp_path: Path) -> None:
    services = _config(tmp_path)["services"]
    assert {"spark-master", "spark-worker-1", "spark-worker-2"} <= set(services)
    assert {"cassandra-1", "cassandra-2", "cassandra-3", "seaweedfs", "airflow-scheduler"} <= set(services)
    for name in ("spark-worker-1", "spark-worker-2"):
        env = services[name].get("environment") or {}
        assert not [k for k in env if k.startswith(("IMGEST_", "AWS_", "PYSPARK_", "AIRFLOW_CONN_"))], name
        assert "org.apache.spark.deploy.worker.Worker" in str(services[name]["command"])
    airflow_env = services["airflow-scheduler"]["environment"]
    assert airflow_env["IMGEST_CASSANDRA_CONSISTENCY"] == "LOCAL_QUORUM"
    assert "spark://spark-master" in airflow_env["AIRFLOW_CONN_SPARK_DEFAULT"]
    assert '"consistency": "LOCAL_QUORUM"' in airflow_env["AIRFLOW_CONN_CASSANDRA_DEFAULT"]
    assert {s["environment"]["CASSANDRA_SEEDS"] for n, s in services.items() if n.startswith("cassandra-")} == {
        "cassandra-1"
    }


def test_dockerfile_installs_from_the_lock_files() -> None:
    text = (ROOT / "docker" / "Dockerfile").read_text()
    assert "COPY requirements requirements" in text
    assert "bash scripts/install.sh" in text  # the same install (requirements/runtime.lock) as `make install`
    install = (ROOT / "scripts" / "install.sh").read_text()
    assert "lock=requirements/runtime.lock" in install
    assert "PYSPARK_" not in text.split("ENV", 1)[1]  # workers built from this image start without PYSPARK_*
