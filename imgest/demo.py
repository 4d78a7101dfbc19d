"""The README's first command: services up, then the main DAG on embedded defaults."""

from __future__ import annotations

import logging
import time

from imgest.services import AirflowServer, CassandraServer, S3Server

log = logging.getLogger(__name__)


def run_demo() -> int:
    """Start Cassandra and S3, prepare Airflow, run the smoke DAG with `airflow dags test`."""
    cassandra, s3, airflow = CassandraServer.default(), S3Server.default(), AirflowServer.default()
    for service in (cassandra, s3):
        print(service.up().message, flush=True)
    print(
        f"airflow home ready in {airflow.prepare(cassandra, s3):.1f}s: AIRFLOW_HOME={airflow.home}",
        flush=True,
    )
    t0 = time.monotonic()
    proc = airflow.airflow("dags", "test", "smoke_services", check=False)
    seconds = time.monotonic() - t0
    ok = proc.returncode == 0
    print(f"airflow dags test smoke_services: {'success' if ok else 'FAILED'} in {seconds:.1f}s")
    if not ok:
        print((proc.stdout or "")[-4000:], (proc.stderr or "")[-4000:])
        return 1
    print(f"Cassandra: {cassandra.address} (keyspace imgest_smoke); S3: {s3.endpoint} bucket {s3.bucket!r}")
    print("Stop the services with: .venv/bin/imgest services down")
    return 0
