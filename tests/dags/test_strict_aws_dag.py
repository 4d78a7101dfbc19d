"""`airflow dags test ingest_imagenet` into shards on a strict AWS (moto with IAM authentication on, refusing a
request signed for another region than its bucket's), as a team on EKS runs it: the Airflow worker holds no key,
only IRSA's web identity token file and AWS_ROLE_ARN, for a role whose policy names the run's bucket alone; the
connection (aws_default: the endpoint, eu-west-1, the bucket in its extra) names no key and no destination is given;
the bucket is in us-west-2, and the run state (locks, staged job files) lives in it. Every task succeeds, and every
read-back reader the report names ran and compared every sample: none skipped for credentials."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from imgest.services import AirflowServer
from imgest.services.demo import run_dag, task_durations, task_results
from imgest.services.strict_aws import StrictAws
from tests.conftest import serve
from tests.integration.test_strict_aws_regions import TOKEN

pytestmark = [pytest.mark.services, pytest.mark.slow]
TASKS = ("validate", "scan", "prepare_bucket", "ingest_shards", "verify_shards", "build_split", "read_throughput")


@pytest.fixture(scope="module")
def aws() -> Iterator[StrictAws]:
    yield from serve("aws")  # type: ignore[misc]


def test_a_pods_dag_run_with_only_a_web_identity(
    airflow_home: AirflowServer, aws: StrictAws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = f"team-{secrets.token_hex(3)}"
    replace(aws.admin(), region="us-west-2").client().create_bucket(
        Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "us-west-2"}
    )
    role = aws.role(f"airflow-{bucket}", [bucket])
    (tmp_path / "token").write_text(TOKEN)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("IMGEST_S3_CREDENTIALS_FILE", "")  # not the embedded server's keys: the pod has none
    monkeypatch.setenv("IMGEST_S3_BUCKET", "")  # the connection's extra names the bucket
    monkeypatch.setenv("IMGEST_S3_ENDPOINT", aws.endpoint)
    monkeypatch.setenv("AWS_ROLE_ARN", role)
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(tmp_path / "token"))
    monkeypatch.setenv("AWS_ROLE_SESSION_NAME", "airflow-worker")
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", aws.endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", aws.region)
    monkeypatch.setenv("IMGEST_STATE_URL", f"s3://{bucket}/_state")
    extra = {"endpoint_url": aws.endpoint, "region_name": aws.region, "bucket": bucket}
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({"conn_type": "aws", "extra": extra}))
    dataset = f"irsa-{secrets.token_hex(2)}"
    ok, _, tail = run_dag(airflow_home, {"sample": True, "target": "shards", "dataset": dataset, "shard_max_count": 8})
    assert ok, tail
    states = {task: state for task, state, _ in task_durations(airflow_home, "ingest_imagenet")}
    for task in (*TASKS, "publish_asset", "gc", "release_lock"):
        assert states[task] == "success", (task, states)
    admin = aws.client("s3")
    doc = json.loads(admin.get_object(Bucket=bucket, Key=f"{dataset}/manifest.json")["Body"].read())
    train = doc["samples"]["train"]
    assert train > 0
    assert task_results(airflow_home, "ingest_imagenet", ("validate",))["validate"]["s3_dest"] == f"s3://{bucket}/{dataset}"
    read = task_results(airflow_home, "ingest_imagenet", ("read_throughput",))["read_throughput"]
    assert read["skipped"] == [], read["skipped"]  # no reader skipped, for credentials or anything else
    assert {"shards-s3-dali/raw", "shards-s3-stream/raw", "shards-s3-webdataset/raw"} <= set(read["readers"])
    assert read["checked"] == train
    locks = admin.list_objects_v2(Bucket=bucket, Prefix="_state/locks/").get("KeyCount", 0)
    assert locks == 0  # taken in the role's bucket, released by the run's last task
    assert admin.list_objects_v2(Bucket=bucket, Prefix="_state/staging/").get("KeyCount", 0) == 0
