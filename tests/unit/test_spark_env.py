"""A spark-submit job's settings and secrets never reach a command line (operators.spark_env): the command line
spark-submit would run, built by the Spark provider's own hook from what imgest's operator hands it, for a
Kubernetes and a YARN master in each deploy mode, with a Cassandra connection that has a password and an S3 one
with keys. The provider's hook refuses a k8s:// master unless the cncf.kubernetes provider imported (it polls the
driver pod through it); that provider is not installed here, so its module attribute is set to a placeholder: the
command line is built by the hook's own code, which never calls it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from imgest.core.errors import ConfigError
from imgest.operators.spark import CassandraIngestSubmitOperator
from imgest.operators.spark_env import route_env, secret_key

PASSWORD, SECRET_KEY = "pw-Zq81-never-shown", "sk-Hb20-never-shown"
K8S = "k8s://https://10.0.0.1:6443"


@pytest.fixture
def conns(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    cassandra = {"conn_type": "cassandra", "host": "10.0.0.9", "port": 9042, "login": "ingest", "password": PASSWORD}
    aws = {"conn_type": "aws", "login": "AKIAEXAMPLE", "password": SECRET_KEY, "extra": {"region_name": "eu-west-1"}}
    monkeypatch.setenv("AIRFLOW_CONN_CASS_PW", json.dumps(cassandra))
    monkeypatch.setenv("AIRFLOW_CONN_AWS_KEYS", json.dumps(aws))
    for mode in ("client", "cluster"):
        k8s = {"conn_type": "spark", "host": K8S, "extra": {"deploy-mode": mode, "namespace": "ml"}}
        yarn = {"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": mode}}
        monkeypatch.setenv(f"AIRFLOW_CONN_SPARK_K8S_{mode.upper()}", json.dumps(k8s))
        monkeypatch.setenv(f"AIRFLOW_CONN_SPARK_YARN_{mode.upper()}", json.dumps(yarn))
    import airflow.providers.apache.spark.hooks.spark_submit as hook_module

    monkeypatch.setattr(hook_module, "kube_client", object(), raising=False)
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)  # submission() writes the task process's environment


def _submitted(conn_id: str, master: str) -> tuple[list[str], dict[str, str]]:
    op = CassandraIngestSubmitOperator(
        task_id="ingest_cassandra", conn_id=conn_id, cassandra_conn_id="cass_pw", source_conn_id="aws_keys"
    )
    env = op._prepare_submit(master, {**op.job_env(), **op.source_env()})
    assert env["IMGEST_CASSANDRA_PASSWORD"] == PASSWORD  # what the job must get, one way or another
    argv = op.submission(master, env)
    return argv, dict(os.environ)


@pytest.mark.parametrize(("conn_id", "master"), [("spark_k8s_client", K8S), ("spark_yarn_client", "yarn")])
def test_client_mode_gives_the_driver_its_secrets_in_its_environment_only(
    conns: None, conn_id: str, master: str
) -> None:
    argv, environ = _submitted(conn_id, master)
    line = " ".join(argv)
    assert PASSWORD not in line
    assert SECRET_KEY not in line
    assert "driverEnv" not in line
    assert "appMasterEnv" not in line
    assert environ["IMGEST_CASSANDRA_PASSWORD"] == PASSWORD  # spark-submit (the driver) inherits it
    assert environ["IMGEST_SOURCE_AWS_SECRET_ACCESS_KEY"] == SECRET_KEY


def test_cluster_mode_on_kubernetes_names_secret_references_never_values(
    conns: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match=r"create one holding the keys .*imgest-cassandra-password"):
        _submitted("spark_k8s_cluster", K8S)  # no Secret named: refused before spark-submit starts
    monkeypatch.setenv("IMGEST_K8S_SECRET", "imgest-job-secrets")
    argv, environ = _submitted("spark_k8s_cluster", K8S)
    line = " ".join(argv)
    assert PASSWORD not in line
    assert SECRET_KEY not in line
    ref = "spark.kubernetes.driver.secretKeyRef"
    assert f"{ref}.IMGEST_CASSANDRA_PASSWORD=imgest-job-secrets:imgest-cassandra-password" in argv
    assert f"{ref}.IMGEST_SOURCE_AWS_SECRET_ACCESS_KEY=imgest-job-secrets:imgest-source-aws-secret-access-key" in argv
    assert "spark.kubernetes.driverEnv.IMGEST_CASSANDRA_HOSTS=10.0.0.9" in argv  # plain settings as they are
    assert "IMGEST_CASSANDRA_PASSWORD" not in environ  # nor left in the task's environment


def test_cluster_mode_on_yarn_with_secrets_is_refused(conns: None) -> None:
    with pytest.raises(ConfigError, match=r"submit in client mode .* or through Spark Connect"):
        _submitted("spark_yarn_cluster", "yarn")


def test_the_routes_by_rule() -> None:
    env = {"IMGEST_CASSANDRA_HOSTS": "h", "IMGEST_CASSANDRA_PASSWORD": "p", "AWS_ACCESS_KEY_ID": "k"}
    assert route_env("spark://m:7077", "client", env) == ({}, env)
    confs, process = route_env(K8S, "cluster", env, "s")
    assert process == {}
    assert confs == {
        "spark.kubernetes.driverEnv.IMGEST_CASSANDRA_HOSTS": "h",
        "spark.kubernetes.driver.secretKeyRef.AWS_ACCESS_KEY_ID": "s:aws-access-key-id",
        "spark.kubernetes.driver.secretKeyRef.IMGEST_CASSANDRA_PASSWORD": "s:imgest-cassandra-password",
    }
    assert route_env("yarn", "cluster", {"IMGEST_CASSANDRA_HOSTS": "h"}) == (
        {"spark.yarn.appMasterEnv.IMGEST_CASSANDRA_HOSTS": "h"},
        {},
    )
    assert secret_key("IMGEST_SSL_KEY_PEM") == "imgest-ssl-key-pem"
