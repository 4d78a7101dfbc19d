"""`airflow dags test ingest_imagenet` with the source on S3 (read through `source_conn_id`), Cassandra target."""

from __future__ import annotations

from pathlib import Path

import pytest

from imgest.core.settings import CassandraSettings
from imgest.flow.demo import run_dag, task_durations
from imgest.services import AirflowServer, CassandraServer, S3Server
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.s3objects import list_objects

pytestmark = [pytest.mark.services, pytest.mark.slow]
BUCKET, PREFIX = "imgest-src", "tests/dag-source/"


def test_cassandra_target_from_an_s3_source(
    airflow_home: AirflowServer, cassandra_server: CassandraServer, s3_server: S3Server, tmp_path: Path
) -> None:
    write_sample(tmp_path, SampleSpec("cls-loc", classes=3, per_class=6, val_per_class=2, seed=31, defects=True))
    client = s3_server.settings().client()
    if BUCKET not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket=BUCKET)
    for obj in list_objects(client, BUCKET, PREFIX):
        client.delete_object(Bucket=BUCKET, Key=obj.key)
    for path in sorted(tmp_path.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), BUCKET, PREFIX + path.relative_to(tmp_path).as_posix())
    ks = "imgest_dag_s3_source"
    with cassandra_session(CassandraSettings(port=cassandra_server.native_port)) as session:
        session.execute(f"DROP KEYSPACE IF EXISTS {ks}", timeout=60)
    conf = {"target": "cassandra", "source": f"s3://{BUCKET}/{PREFIX}", "dataset": "dagtest-s3src", "keyspace": ks}
    ok, _, tail = run_dag(airflow_home, {**conf, "source_conn_id": "aws_default"})
    assert ok, tail
    states = {task: state for task, state, _ in task_durations(airflow_home, "ingest_imagenet")}
    for task in ("scan", "ingest_cassandra", "verify_cassandra", "read_throughput"):
        assert states[task] == "success", (task, states)
    with cassandra_session(CassandraSettings(port=cassandra_server.native_port)) as session:
        record = session.execute(f"SELECT status, quarantine_count FROM {ks}.dataset_versions").one()
        stored = session.execute(f"SELECT count(*) FROM {ks}.data").one()[0]
    assert record.status == "complete"
    assert (stored, record.quarantine_count) == (18 + 6 + 8, 5)  # as the same tree from a local folder
