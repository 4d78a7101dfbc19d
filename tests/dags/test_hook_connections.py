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
