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
from tests.integration.test_strict_aws_regions import TOKEN, sessions_of

pytestmark = [pytest.mark.services, pytest.mark.slow]
SESSION_S = 45  # each session the role gets lasts this long: the server refuses it afterwards, as AWS does
DEMO_TRAIN = 10 * 20 + 8  # the generated sample's train images that are kept (tests/packaging/test_provider.py)
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
    role = aws.role(f"airflow-{bucket}", [bucket], session_s=SESSION_S)  # the run outlives many of its sessions
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
    # no budget for the read-back check: every reader, DALI's s3:// one last, reads with the role's renewed keys
    # (within 60 s, on this server's signed and renewed requests, the first readers can leave DALI's no time)
    conf = {"sample": True, "target": "shards", "dataset": dataset, "shard_max_count": 8, "check_seconds": 0}
    ok, seconds, tail = run_dag(airflow_home, conf)
    assert ok, tail
    assert seconds > 2 * SESSION_S  # the run outlived its first sessions
    assert sessions_of(aws, role) > 3  # and its clients renewed from the web identity as each ran out
    states = {task: state for task, state, _ in task_durations(airflow_home, "ingest_imagenet")}
    for task in (*TASKS, "publish_asset", "gc", "release_lock"):
        assert states[task] == "success", (task, states)
    admin = aws.client("s3")
    doc = json.loads(admin.get_object(Bucket=bucket, Key=f"{dataset}/manifest.json")["Body"].read())
    train = doc["samples"]["train"]
    assert train == DEMO_TRAIN
    assert (
        task_results(airflow_home, "ingest_imagenet", ("validate",))["validate"]["s3_dest"]
        == f"s3://{bucket}/{dataset}"
    )
    read = task_results(airflow_home, "ingest_imagenet", ("read_throughput",))["read_throughput"]
    assert read["skipped"] == [], read["skipped"]  # no reader skipped, for credentials or anything else
    assert {"shards-s3-dali/raw", "shards-s3-stream/raw", "shards-s3-webdataset/raw"} <= set(read["readers"])
    assert read["checked"] == train
    locks = admin.list_objects_v2(Bucket=bucket, Prefix="_state/locks/").get("KeyCount", 0)
    assert locks == 0  # taken in the role's bucket, released by the run's last task
    assert admin.list_objects_v2(Bucket=bucket, Prefix="_state/staging/").get("KeyCount", 0) == 0


CHECK = """
import json, sys
from types import SimpleNamespace
from imgest.operators.refresh import CheckVersionsOperator
extra = json.loads(sys.argv[1])
context = {"triggering_asset_events": {"a": [SimpleNamespace(extra=extra)]}, "run_id": "asset_triggered__x",
           "ti": SimpleNamespace(task_id="check_versions", try_number=1)}
try:
    print(json.dumps({"ok": CheckVersionsOperator(task_id="check_versions").execute(context)}))
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
"""


def test_check_datasets_checks_a_version_as_a_writer_with_only_a_web_identity(
    airflow_home: AirflowServer, aws: StrictAws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """check_datasets' task (its operator, with the context an Asset event gives it) on a version published by the
    CLI: it keeps its run state where the dataset's writers do (IMGEST_STATE_URL in the role's bucket), waits for
    the dataset's lock (a writer holding it: refused after the wait, naming it) and, once free, reads the version
    back with every reader and records the report in manifest.json, by a switch conditional on what it read."""
    import subprocess
    import sys

    from imgest.cli import main
    from imgest.core import locks
    from imgest.core.lock_stores import S3LockStore
    from imgest.sources.devdata.sample import SampleSpec, write_sample
    from tests.integration.test_strict_aws_regions import pod_env

    bucket = f"check-{secrets.token_hex(3)}"
    aws.client("s3").create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": aws.region})
    pod_env(monkeypatch, aws, aws.role(f"check-{bucket}", [bucket]), tmp_path)
    monkeypatch.setenv("IMGEST_S3_CREDENTIALS_FILE", "")
    monkeypatch.setenv("IMGEST_STATE_URL", f"s3://{bucket}/_state")
    write_sample(tmp_path / "tree", SampleSpec("imagefolder", classes=2, per_class=4, val_per_class=1, seed=3))
    dest = f"s3://{bucket}/checked"
    ingest = ["ingest", "shards", str(tmp_path / "tree"), "--dest", dest, "--max-count", "4", "--dataset", "checked"]
    assert main(ingest) == 0
    admin = aws.client("s3")
    published = json.loads(admin.get_object(Bucket=bucket, Key="checked/manifest.json")["Body"].read())
    # check_seconds 0: every reader reads the whole sample whatever the machine's load (what this test proves is
    # each reader's access as the role; the budget's cuts are tests/readback/test_read_budget_step.py's)
    conf = {"target": "shards", "dataset": "checked", "s3_dest": dest, "source": str(tmp_path / "tree")}
    extra = {"conf": {**conf, "check_seconds": 0}, "version": published["key"]}
    extra_conn = {"endpoint_url": aws.endpoint, "region_name": aws.region}
    env = {**airflow_home.env(), "AIRFLOW_CONN_AWS_DEFAULT": json.dumps({"conn_type": "aws", "extra": extra_conn})}
    env["IMGEST_LOCK_WAIT_S"] = "2"
    store = S3LockStore(f"s3://{bucket}/_state", aws.admin())
    other = locks.airflow_holder("refresh_checked", "scheduled__y", lease_s=600)
    assert locks.try_acquire("checked", other, store) is None
    run = subprocess.run([sys.executable, "-c", CHECK, json.dumps(extra)], env=env, capture_output=True, text=True)
    busy = json.loads(run.stdout.strip().splitlines()[-1])
    assert "DatasetBusyError" in busy["error"], run.stderr[-3000:]
    assert "refresh_checked run scheduled__y" in busy["error"]
    assert locks.release("checked", other, store)
    run = subprocess.run([sys.executable, "-c", CHECK, json.dumps(extra)], env=env, capture_output=True, text=True)
    done = json.loads(run.stdout.strip().splitlines()[-1])
    assert "ok" in done, (done, run.stderr[-3000:])
    read = done["ok"][0]["read_throughput"]
    assert read["skipped"] == []
    assert read["budget_s"] == 0.0
    assert read["budget_cut"] == []
    assert {"shards-s3-dali/raw", "shards-s3-stream/raw", "shards-s3-webdataset/raw"} <= set(read["readers"])
    after = json.loads(admin.get_object(Bucket=bucket, Key="checked/manifest.json")["Body"].read())
    assert after["key"] == published["key"]
    assert after["checks"]["read_throughput"].endswith("read_throughput.json")
    assert locks.read("checked", store) is None  # given back


def test_a_refresh_dag_with_only_a_web_identity(
    airflow_home: AirflowServer, aws: StrictAws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`airflow dags test refresh_<name>` of a dataset registered with a shards target in the role's bucket: the
    first refresh publishes every image, a second one after a change publishes the next version, each with every
    task green, the run state in the bucket and no key anywhere."""
    from imgest.sources.devdata.sample import SampleSpec, write_sample
    from tests.integration.test_strict_aws_regions import pod_env

    bucket = f"refresh-{secrets.token_hex(3)}"
    aws.client("s3").create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": aws.region})
    pod_env(monkeypatch, aws, aws.role(f"refresh-{bucket}", [bucket]), tmp_path)
    monkeypatch.setenv("IMGEST_S3_CREDENTIALS_FILE", "")
    monkeypatch.setenv("IMGEST_STATE_URL", f"s3://{bucket}/_state")
    extra = {"endpoint_url": aws.endpoint, "region_name": aws.region}
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({"conn_type": "aws", "extra": extra}))
    source = tmp_path / "src"
    write_sample(source, SampleSpec("imagefolder", classes=2, per_class=4, val_per_class=1, seed=21))
    name = f"irsa{secrets.token_hex(2)}"
    datasets = tmp_path / "datasets.toml"
    datasets.write_text(
        f'[datasets.{name}]\nsource = "{source}"\nlayout = "imagefolder"\ntargets = ["shards"]\n'
        f'schedule = "@daily"\ns3_dest = "s3://{bucket}/{name}"\nshard_max_count = 4\n'
    )
    monkeypatch.setenv("IMGEST_DATASETS_FILE", str(datasets))
    admin, keys = aws.client("s3"), []
    for round_ in range(2):
        proc = airflow_home.airflow("dags", "test", f"refresh_{name}", check=False)
        assert proc.returncode == 0, (proc.stdout or "")[-3000:] + (proc.stderr or "")[-3000:]
        states = {task: state for task, state, _ in task_durations(airflow_home, f"refresh_{name}")}
        assert states.get("shards.ingest") == "success", states
        assert not [t for t, s in states.items() if s not in ("success", "skipped")], states
        doc = json.loads(admin.get_object(Bucket=bucket, Key=f"{name}/manifest.json")["Body"].read())
        keys.append(doc["key"])
        if round_ == 0:
            assert sum(doc["samples"].values()) == 10
            next(iter(sorted((source / "train").rglob("*.JPEG")))).unlink()
    assert keys[0] != keys[1]
    assert sum(doc["samples"].values()) == 9  # one image removed at the source
    assert admin.list_objects_v2(Bucket=bucket, Prefix="_state/locks/").get("KeyCount", 0) == 0
