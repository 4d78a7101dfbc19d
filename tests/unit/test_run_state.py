"""Where a run keeps its state: the local state folder on one machine; across hosts $IMGEST_STATE_URL, else beside
the run's S3 destination, else the validate step refuses the run naming IMGEST_STATE_URL."""

from __future__ import annotations

import pytest

from imgest.core.errors import ConfigError
from imgest.core.lock_stores import state_setting, state_url
from imgest.core.run_state import Deployment, state_url_for
from imgest.flow.steps import s3_destination, validate_conf

ONE_MACHINE = Deployment("LocalExecutor", "local[*]")
CELERY = Deployment("CeleryExecutor", "local[*]")
CLUSTER = Deployment("LocalExecutor", "spark://10.0.0.5:7077")


@pytest.mark.parametrize(
    ("executor", "master", "one"),
    [
        ("LocalExecutor", "local[*]", True),
        ("SequentialExecutor", "local", True),
        ("airflow.executors.local_executor.LocalExecutor", "local[4]", True),
        ("", "local-cluster[2,1,1024]", True),  # outside Airflow (the CLI): the master alone
        ("LocalExecutor", "spark://127.0.0.1:7077", False),  # executors are other processes, other disks
        ("CeleryExecutor", "local[*]", False),  # tasks on other workers
        ("KubernetesExecutor", "local[*]", False),
        ("LocalExecutor,KubernetesExecutor", "local[*]", False),  # several: one of them elsewhere
        ("mine:my_company.executors.LocalExecutor", "yarn", False),
    ],
)
def test_one_machine_needs_local_tasks_and_a_local_master(executor: str, master: str, one: bool) -> None:
    assert Deployment(executor, master).one_machine() is one


def test_one_machine_keeps_the_local_state_folder() -> None:
    assert state_url_for(ONE_MACHINE, None) is None
    assert state_url_for(ONE_MACHINE, "s3://imgest/imagenet") is None


def test_across_hosts_the_state_goes_beside_the_s3_destination() -> None:
    assert state_url_for(CELERY, "s3://datasets/imagenet/v") == "s3://datasets/_imgest-state"
    assert state_url_for(CLUSTER, "s3://b") == "s3://b/_imgest-state"


def test_the_setting_wins_and_local_is_an_explicit_choice() -> None:
    assert state_url_for(CELERY, "s3://datasets/x", "s3://state/imgest") == "s3://state/imgest"
    assert state_url_for(CELERY, None, "s3://state/imgest") == "s3://state/imgest"
    assert state_url_for(ONE_MACHINE, None, "s3://state/imgest") == "s3://state/imgest"
    assert state_url_for(CLUSTER, None, "local") is None  # every host mounts the same $IMGEST_HOME


def test_across_hosts_without_s3_is_an_error_naming_the_variable() -> None:
    with pytest.raises(ConfigError) as err:
        state_url_for(Deployment("KubernetesExecutor", "k8s://https://api:6443"), None)
    message = str(err.value)
    assert "executor KubernetesExecutor, Spark master k8s://https://api:6443" in message
    assert "IMGEST_STATE_URL=s3://bucket/prefix" in message
    assert "IMGEST_STATE_URL=local" in message


def test_the_variable_local_means_no_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IMGEST_STATE_URL", "local")
    assert (state_setting(), state_url()) == ("local", None)
    monkeypatch.setenv("IMGEST_STATE_URL", "/mnt/shared")
    with pytest.raises(ConfigError, match="expected s3://bucket/prefix, or local"):
        state_url()


def test_s3_destination_is_the_shards_target_on_s3() -> None:
    assert s3_destination({"sample": True, "target": "shards", "dataset": "d"}) == "s3://imgest/d"  # the default
    assert s3_destination({"sample": True, "target": "shards", "s3_dest": "/data/shards"}) is None
    assert s3_destination({"sample": True, "target": "cassandra"}) is None
    assert s3_destination({"sample": True, "target": "files"}) is None


def test_validate_refuses_a_run_across_hosts_with_nowhere_for_its_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """The DAG's validate step: Cassandra from a local folder on Celery workers, with no S3 anywhere."""
    monkeypatch.delenv("IMGEST_STATE_URL", raising=False)
    conf = {"target": "cassandra", "source": "/data/imagenet", "dataset": "imnet"}
    with pytest.raises(ConfigError, match="IMGEST_STATE_URL=s3://bucket/prefix"):
        validate_conf(conf, CELERY)
    assert validate_conf(conf, ONE_MACHINE)["dataset"] == "imnet"
    assert validate_conf(conf)["dataset"] == "imnet"  # no deployment: the request alone (the CLI, the tests)
    on_s3 = {**conf, "source": "s3://datasets-src/imagenet/"}
    shards = {**on_s3, "target": "shards", "s3_dest": "s3://datasets/imnet"}
    assert validate_conf(shards, CELERY)["s3_dest"] == "s3://datasets/imnet"
    monkeypatch.setenv("IMGEST_STATE_URL", "s3://state/imgest")
    assert validate_conf(on_s3, CELERY)["target"] == "cassandra"


def test_validate_refuses_local_folders_no_host_shares(monkeypatch: pytest.MonkeyPatch) -> None:
    """Across hosts a local source and the files target's folder must be on a mount every host has (named in
    IMGEST_SHARED_MOUNTS); the sample is fine once the scan copies it to an S3 state store."""
    monkeypatch.setenv("IMGEST_STATE_URL", "s3://state/imgest")
    monkeypatch.delenv("IMGEST_SHARED_MOUNTS", raising=False)
    local = {"target": "cassandra", "source": "/data/imagenet", "dataset": "imnet"}
    with pytest.raises(ConfigError, match=r"the source folder /data/imagenet at the same path.*IMGEST_SHARED_MOUNTS"):
        validate_conf(local, CELERY)
    files = {"target": "files", "source": "s3://src/imagenet/", "dataset": "imnet", "files_dest": "/srv/files/imnet"}
    with pytest.raises(ConfigError, match=r"the files target's folder /srv/files/imnet"):
        validate_conf(files, CLUSTER)
    assert validate_conf({"target": "shards", "sample": True, "dataset": "s"}, CELERY)["sample"] is True
    monkeypatch.setenv("IMGEST_SHARED_MOUNTS", "/data,/srv/files")
    assert validate_conf(local, CELERY)["source"] == "/data/imagenet"
    assert validate_conf(files, CLUSTER)["files_dest"] == "/srv/files/imnet"
    monkeypatch.setenv("IMGEST_SHARED_MOUNTS", "/data/imagenet2")  # a sibling is not a parent
    with pytest.raises(ConfigError, match="the source folder"):
        validate_conf(local, CELERY)
    assert validate_conf(local, ONE_MACHINE)["dataset"] == "imnet"  # one machine: nothing to share
