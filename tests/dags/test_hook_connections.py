"""The Cassandra hook reads a real Airflow connection (from the environment, as a deployment's secrets backend
gives it) and never falls back to 127.0.0.1: a connection without a host is an error naming it."""

from __future__ import annotations

import json
import subprocess
import sys

from imgest.services import AirflowServer

PROBE = """
import json, sys
from imgest.core.errors import ConfigError
from imgest.operators.hooks import ImgestCassandraHook
out = {}
for conn_id in sys.argv[1:]:
    try:
        s = ImgestCassandraHook(cassandra_conn_id=conn_id).settings()
        out[conn_id] = {"hosts": list(s.hosts), "port": s.port}
    except ConfigError as exc:
        out[conn_id] = {"error": str(exc)}
print(json.dumps(out))
"""


def test_a_cassandra_connection_without_a_host_is_an_error_naming_it(airflow_home: AirflowServer) -> None:
    env = {
        **airflow_home.env(),
        "AIRFLOW_CONN_IMGEST_NOHOST": json.dumps({"conn_type": "cassandra", "port": 9042}),
        "AIRFLOW_CONN_IMGEST_RING": json.dumps({"conn_type": "cassandra", "host": "10.1.0.5, 10.1.0.6", "port": 9142}),
    }
    run = subprocess.run(
        [sys.executable, "-c", PROBE, "imgest_nohost", "imgest_ring"], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["imgest_ring"] == {"hosts": ["10.1.0.5", "10.1.0.6"], "port": 9142}
    error = got["imgest_nohost"]["error"]
    assert "'imgest_nohost' has no host" in error
    assert "AIRFLOW_CONN_IMGEST_NOHOST" in error


RESOLVE = """
import json, sys
from imgest.flow.steps import validate_conf
from imgest.operators.base import RequestOperator
out = {}
for target, cassandra_conn in (("shards", "imgest_absent"), ("files", "imgest_absent"), ("cassandra", "imgest_absent"),
                               ("cassandra-only", "imgest_cass_only")):
    conf = {"sample": True, "target": target.split("-")[0], "dataset": "one", "s3_dest": "s3://only-bucket/one",
            "files_dest": "/tmp/one", "keyspace": "one"}
    op = RequestOperator(task_id=f"t_{target.replace('-', '_')}", request=validate_conf(conf), out_dir="/tmp",
                         cassandra_conn_id=cassandra_conn,
                         aws_conn_id="imgest_aws_absent" if target == "cassandra-only" else "imgest_s3_only")
    try:
        request, cassandra, s3 = op.resolved()
        out[target] = {"cassandra": cassandra is not None, "s3_bucket": s3.bucket if s3 else None}
    except Exception as exc:
        out[target] = {"error": f"{type(exc).__name__}: {exc}"}
print(json.dumps(out))
"""


def test_a_deployment_with_one_target_needs_no_connection_of_the_other(airflow_home: AirflowServer) -> None:
    """A shards-only (or files-only) deployment has no Cassandra connection at all, a Cassandra-only one no AWS
    connection: the tasks that take the request read each store's connection only for its own target; there, its
    absence is an error naming it."""
    env = {
        **airflow_home.env(),
        "AIRFLOW_CONN_IMGEST_S3_ONLY": json.dumps(
            {"conn_type": "aws", "login": "k", "password": "s", "extra": {"endpoint_url": "http://127.0.0.1:1"}}
        ),
        "AIRFLOW_CONN_IMGEST_CASS_ONLY": json.dumps({"conn_type": "cassandra", "host": "10.9.0.1", "port": 9042}),
    }
    env.pop("AIRFLOW_CONN_IMGEST_ABSENT", None)
    run = subprocess.run([sys.executable, "-c", RESOLVE], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["shards"] == {"cassandra": False, "s3_bucket": "only-bucket"}
    assert got["files"] == {"cassandra": False, "s3_bucket": None}
    assert "imgest_absent" in got["cassandra"]["error"]
    assert got["cassandra-only"] == {"cassandra": True, "s3_bucket": None}


BUCKET = """
import json, os
from imgest.core.errors import ConfigError
from imgest.flow.steps import validate_conf
from imgest.operators.hooks import connection_bucket
out = {"with": connection_bucket("imgest_with_bucket"), "without": connection_bucket("imgest_s3_only"),
       "absent": connection_bucket("imgest_aws_absent")}
conf = {"sample": True, "target": "shards", "dataset": "ds"}
out["dest"] = validate_conf(conf, bucket=out["with"])["s3_dest"]
try:
    validate_conf(conf, bucket=out["without"])
except ConfigError as exc:
    out["error"] = str(exc)
print(json.dumps(out))
"""


def test_the_default_destination_is_the_connections_bucket_and_no_other(airflow_home: AirflowServer) -> None:
    """An empty s3_dest goes to the AWS connection's extra bucket; a connection (or none) that names no bucket,
    without IMGEST_S3_BUCKET, is refused in validate rather than sent to a bucket nobody chose."""
    aws = {"conn_type": "aws", "login": "k", "password": "s"}
    env = {
        **airflow_home.env(),
        "AIRFLOW_CONN_IMGEST_WITH_BUCKET": json.dumps({**aws, "extra": {"bucket": "team-shards"}}),
        "AIRFLOW_CONN_IMGEST_S3_ONLY": json.dumps(aws),
    }
    env.pop("IMGEST_S3_BUCKET", None)
    run = subprocess.run([sys.executable, "-c", BUCKET], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert (got["with"], got["without"], got["absent"]) == ("team-shards", None, None)
    assert got["dest"] == "s3://team-shards/ds"
    assert "no shard destination for 'ds'" in got["error"]
    assert "IMGEST_S3_BUCKET" in got["error"]


TLS_PROBE = """
import json, os
from imgest.core.settings import CassandraSettings
from imgest.operators.hooks import ImgestCassandraHook
out = {}
for conn_id in ("imgest_tls_text", "imgest_tls_files"):
    env = ImgestCassandraHook(cassandra_conn_id=conn_id).spark_env()
    os.environ.update(env)
    s = CassandraSettings.from_env()
    for k in env:
        os.environ.pop(k)
    out[conn_id] = {"env": sorted(k for k in env if "SSL" in k), "ca": s.ssl_ca_data, "cert": s.ssl_cert_data,
                    "key": (s.ssl_key_data or "").splitlines()[0]}
print(json.dumps(out))
"""


def test_mutual_tls_travels_from_the_connection_as_texts(airflow_home: AirflowServer, tmp_path) -> None:
    """A connection holding the CA, client certificate and key as PEM texts (extras ssl_ca, ssl_cert, ssl_key), or
    as paths of this host (the provider's ssl_options): either way the Spark job's environment carries the texts
    (the driver may run on another host), the key as PKCS#8, and the job's settings read them back."""
    from imgest.services.tls import make_server_tls

    tls = make_server_tls(tmp_path / "tls", "10.0.0.5")
    assert tls.client_cert is not None
    assert tls.client_key is not None
    texts = {
        "ssl_ca": tls.ca_pem.read_text(),
        "ssl_cert": tls.client_cert.read_text(),
        "ssl_key": tls.client_key.read_text(),
    }
    paths = {"ca_certs": str(tls.ca_pem), "certfile": str(tls.client_cert), "keyfile": str(tls.client_key)}
    conn = {"conn_type": "cassandra", "host": "10.0.0.5", "port": 9242}
    env = {
        **airflow_home.env(),
        "AIRFLOW_CONN_IMGEST_TLS_TEXT": json.dumps({**conn, "extra": texts}),
        "AIRFLOW_CONN_IMGEST_TLS_FILES": json.dumps({**conn, "extra": {"ssl_options": paths}}),
    }
    run = subprocess.run([sys.executable, "-c", TLS_PROBE], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    names = ["IMGEST_CASSANDRA_SSL_CA_PEM", "IMGEST_CASSANDRA_SSL_CERT_PEM", "IMGEST_CASSANDRA_SSL_KEY_PEM"]
    for conn_id in ("imgest_tls_text", "imgest_tls_files"):
        assert got[conn_id]["env"] == names  # texts only: no path of this host
        assert got[conn_id]["ca"] == tls.ca_pem.read_text()
        assert got[conn_id]["cert"] == tls.client_cert.read_text()
        assert got[conn_id]["key"] == "-----BEGIN PRIVATE KEY-----"  # SEC1 on disk, PKCS#8 shipped
