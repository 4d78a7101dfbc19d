"""Where a run's state lives (locks, work folders, staged job files): decided once per task, never assumed.

On one machine (Airflow's LocalExecutor or SequentialExecutor, and a ``local[...]`` Spark master) every task and
executor shares this machine's disk, and the state stays in ``$IMGEST_HOME``. Across hosts nothing may pass
through a local disk, so the state goes to object storage without anyone opting in:

- ``$IMGEST_STATE_URL=s3://bucket/prefix`` when set (``local`` keeps the local state folder: the operator says
  every host mounts the same ``$IMGEST_HOME``);
- else ``s3://<bucket of the run's S3 destination>/_imgest-state``, reached with that destination's connection;
- else the run cannot keep its state anywhere every host reaches: a ConfigError naming ``IMGEST_STATE_URL``.

``state_url_for`` is the one function that decides (pure); Airflow tasks feed it their deployment
(``imgest.operators.state``).
"""

from __future__ import annotations

from dataclasses import dataclass

from imgest.core.errors import ConfigError
from imgest.core.lock_stores import LOCAL_STATE, STATE_URL_ENV, derived_state_url

ONE_MACHINE_EXECUTORS = ("LocalExecutor", "SequentialExecutor")


@dataclass(frozen=True)
class Deployment:
    """What runs a run's steps: Airflow's ``[core] executor`` (several, comma separated, may be configured;
    '' outside Airflow) and the Spark master the jobs are submitted to."""

    executor: str
    master: str

    def executors(self) -> list[str]:
        """The executors' class names ('my_alias:airflow.executors...LocalExecutor' gives LocalExecutor)."""
        names = [e.strip() for e in self.executor.split(",") if e.strip()]
        return [name.rpartition(":")[2].rpartition(".")[2] for name in names]

    def one_machine(self) -> bool:
        """True when every task and every Spark executor runs on this machine (and shares its disk)."""
        local_tasks = all(name in ONE_MACHINE_EXECUTORS for name in self.executors())
        return local_tasks and self.master.strip().startswith("local")

    def describe(self) -> str:
        return f"executor {self.executor or 'none'}, Spark master {self.master}"


def state_url_for(deployment: Deployment, s3_dest: str | None, configured: str = "") -> str | None:
    """The run's state URL (None: the local state folder) for DEPLOYMENT, the run's S3 destination S3_DEST (None
    when it writes no S3) and CONFIGURED (``$IMGEST_STATE_URL`` as set: '' when unset); ConfigError naming
    IMGEST_STATE_URL when the run spans hosts and no store every host reaches is known."""
    if configured == LOCAL_STATE:
        return None
    if configured:
        return configured
    if deployment.one_machine():
        return None
    if s3_dest and s3_dest.startswith("s3://"):
        return derived_state_url(s3_dest)
    raise ConfigError(
        f"this run spans hosts ({deployment.describe()}) and writes nothing to S3, so its lock and work folder have "
        f"no store every host reaches: set {STATE_URL_ENV}=s3://bucket/prefix where Airflow's workers run (a bucket "
        f"the aws_default connection reaches), or {STATE_URL_ENV}={LOCAL_STATE} if every worker and Spark node "
        "mounts the same $IMGEST_HOME"
    )


SHARED_ENV = "IMGEST_SHARED_MOUNTS"  # folders every Airflow worker and Spark node mounts at the same path


def shared_mounts(setting: str) -> tuple[str, ...]:
    """The folders of SETTING (``$IMGEST_SHARED_MOUNTS``: comma or colon separated absolute paths)."""
    return tuple(p.strip().rstrip("/") for p in setting.replace(":", ",").split(",") if p.strip().startswith("/"))


def check_shared(deployment: Deployment, folders: dict[str, str], setting: str) -> None:
    """On a DEPLOYMENT across hosts, each of FOLDERS (what it is -> local path the run reads or writes on every
    host: a local source, the files target's folder) must lie under a folder of SETTING (``$IMGEST_SHARED_MOUNTS``)
    that every host mounts; ConfigError naming each one and what to do otherwise. Nothing to check on one machine."""
    if deployment.one_machine():
        return
    mounts = shared_mounts(setting)

    def shared(path: str) -> bool:
        return any(path == m or path.startswith(m + "/") for m in mounts)

    problems = [f"{what} {path}" for what, path in folders.items() if path and not shared(path)]
    if problems:
        raise ConfigError(
            f"this run spans hosts ({deployment.describe()}) and every Airflow worker and Spark node must see "
            f"{'; '.join(problems)} at the same path, which no host shares with another by default: put it on "
            f"storage every host mounts and name that mount in {SHARED_ENV} (e.g. {SHARED_ENV}=/mnt/datasets), or "
            "use an s3:// source and the shards or cassandra target, which need no shared disk"
        )
