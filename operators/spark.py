"""SparkSubmitOperators for imgest's jobs: credentials go to the job's environment at execute time only.

Credentials are read through a hook inside ``execute`` and handed to spark-submit (the driver, client deploy
mode) as environment variables, after templates are rendered: they never appear in rendered fields, XCom,
arguments or logs. The driver ships them to executors inside its tasks. On a master other than local, the
imgest package goes along as ``--py-files``. Each job is its own subclass naming the job file and the hook
that reaches its store.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, ClassVar

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

DEFER_TIMEOUT = timedelta(hours=24)  # a deferred job's wait where its task has no execution_timeout


class ImgestSparkSubmitOperator(SparkSubmitOperator):
    """Submit jobs/<job>.py on the `spark_default` connection with imgest's Spark settings."""

    job: ClassVar[str]
    template_fields = (*SparkSubmitOperator.template_fields, "source_conn_id", "lock_dataset")

    def __init__(
        self,
        *,
        source_conn_id: str = "",
        lock_dataset: str = "",
        state_conn_id: str = "aws_default",
        deferrable: bool | None = None,
        **kwargs: Any,
    ) -> None:
        from imgest.spark.submit import job_path

        kwargs.setdefault("conn_id", "spark_default")
        # $IMGEST_SPARK_POOL: the pool whose slots are the Spark jobs the master can run at once (imgest's services
        # create `spark` and set it); unset, Airflow's default_pool: a task never waits on a pool that is missing.
        kwargs.setdefault("pool", os.environ.get("IMGEST_SPARK_POOL") or "default_pool")
        kwargs.setdefault("name", f"imgest-{self.job}")
        super().__init__(application=str(job_path(self.job)), **kwargs)
        self.source_conn_id = source_conn_id  # an s3:// source's connection ('' for a local source)
        self.lock_dataset = lock_dataset  # the dataset whose lock this run holds: its lease is renewed while we run
        self.state_conn_id = state_conn_id  # the connection of the run's state store (and of an S3 lock store)
        # through Spark Connect, let go of the worker while Spark runs the job's partitions (operators.connect_job)
        self.deferrable = deferrable
        self._resumed: dict[str, Any] = {}  # the trigger's last event, when this run of the task follows one

    def source_env(self) -> dict[str, str]:
        """IMGEST_SOURCE_* variables from the source's connection (none for a local source)."""
        if not self.source_conn_id:
            return {}
        from imgest.operators.hooks import ImgestS3Hook
        from imgest.sources.s3source import source_env

        return source_env(ImgestS3Hook(aws_conn_id=self.source_conn_id).settings())

    def job_env(self) -> dict[str, str]:
        """Environment variables that reach the store (overridden per job)."""
        return {}

    def state_env(self) -> dict[str, str]:
        """The keys of $IMGEST_STATE_URL's store (STATE_CONN_ID), where the driver stages the job's files."""
        from imgest.core.lock_stores import state_url

        if state_url() is None:
            return {}
        from imgest.operators.hooks import ImgestS3Hook

        return ImgestS3Hook(aws_conn_id=self.state_conn_id).spark_env()

    def master(self) -> str:
        """The master named by the Spark connection (its host, with port when given)."""
        from imgest.operators.state import spark_master

        return spark_master(self._conn_id)

    def execute(self, context: Any) -> None:
        from imgest.core import locks
        from imgest.spark.partitions import is_connect

        master = self.master()
        env = {**(self.env_vars or {}), **self.state_env(), **self.job_env(), **self.source_env()}
        if not is_connect(master):  # through Connect the job is the session's thin client: no spark-submit here
            env = self._prepare_submit(master, env)
            if self.deferrable:
                self.log.info("%s runs attached: only a Spark Connect master (sc://) lets a job free its worker "
                              "(%s is %s)", self.job, self._conn_id, master)  # fmt: skip
        with self._lease(context):
            env = {**env, **locks.holder_env()}  # the driver fences its publishing with it
            try:
                if is_connect(master):
                    self._run_connect(master, env, context)
                elif not self._in_reused_driver(master, env):
                    before = dict(os.environ)
                    try:
                        self.submission(master, env)
                        super().execute(context)
                    finally:  # what spark-submit inherited leaves with it (`dags test` runs every task in one process)
                        os.environ.clear()
                        os.environ.update(before)
            except Exception:
                self._fail_if_lock_lost()
                raise

    def _prepare_submit(self, master: str, env: dict[str, str]) -> dict[str, str]:
        """imgest's Spark settings and, on a cluster, the package as --py-files; returns ENV with the driver's
        Python and address."""
        from imgest.spark.conf import needs_shipping, spark_conf, submit_env
        from imgest.spark.submit import package_zip

        keep = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_LOCAL_IP")
        self.conf = {**spark_conf(master=master), **(self.conf or {})}
        if needs_shipping(master) and not self.py_files:
            self.py_files = str(package_zip())  # executors elsewhere import imgest from the submission
        return {**{k: v for k, v in submit_env(master).items() if k in keep}, **env}

    def submission(self, master: str, env: dict[str, str]) -> list[str]:
        """Hand ENV to the job the way its master and deploy mode allow (operators.spark_env: the task's own
        environment, which spark-submit inherits, or Spark settings that name no secret's value), never as the
        provider's env_vars; returns the command line spark-submit runs with."""
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        from imgest.operators.spark_env import K8S_SECRET_ENV, route_env

        mode = SparkSubmitHook(conn_id=self._conn_id, deploy_mode=self._deploy_mode)._connection["deploy_mode"]
        from imgest.spark.distribution import spark_env

        confs, process = route_env(master, mode or "client", env, os.environ.get(K8S_SECRET_ENV, ""))
        self.conf, self.env_vars = {**(self.conf or {}), **confs}, {}
        os.environ.update(process)  # this task's process is the job's alone
        os.environ.update(spark_env(dict(os.environ)))  # the provider runs `spark-submit` from PATH: Spark's
        return self._get_hook()._build_spark_submit_command(self.application)

    def _run_connect(self, master: str, job_env: dict[str, str], context: Any) -> None:
        """Run the job through Spark Connect at MASTER as a child of this task (its output in the task's log, its
        settings and secrets in its environment only; the connection's password as its Connect token). Deferrable:
        the job lets go of this worker while Spark runs its partitions, and the task defers until they ran
        (operators.connect_job)."""
        import subprocess

        from airflow.sdk.exceptions import AirflowException

        from imgest.operators.compat import connection_or_none
        from imgest.operators.connect_job import MAX_DEFERRALS, defer_env, detaches, spark_deferrable_default
        from imgest.spark.detach import DETACHED_EXIT
        from imgest.spark.submit import connect_command

        conn = connection_or_none(self._conn_id)
        token = {"SPARK_CONNECT_AUTHENTICATE_TOKEN": conn.password} if conn is not None and conn.password else {}
        cmd = connect_command(self.job, [str(a) for a in self.application_args or []], master)
        # a run back from its trigger goes on as it began, whatever the setting says now
        deferrable = bool(self._resumed) or (
            self.deferrable if self.deferrable is not None else spark_deferrable_default()
        )
        self.log.info("running %s through Spark Connect at %s (no JVM in this worker%s)", self.job, master,
                      "; deferred while Spark runs its partitions" if deferrable else "")  # fmt: skip
        if deferrable and not detaches(self._resumed):
            self.log.warning("%s deferred %s times: this run stays attached to its end", self.job, MAX_DEFERRALS)
        with defer_env(context, self._resumed if deferrable else None) as extra:
            env = {**os.environ, **job_env, **token, **extra}
            self._connect_proc = subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
            )
            for line in self._connect_proc.stdout or ():
                self.log.info("%s", line.rstrip())
            rc = self._connect_proc.wait()
            if deferrable and rc == DETACHED_EXIT:
                self._defer_to_operation(master, extra, context)
        if rc != 0:
            raise AirflowException(f"Cannot execute: {self.job} through Spark Connect at {master}. Exit code: {rc}.")

    def _defer_to_operation(self, master: str, extra: dict[str, str], context: Any) -> None:
        """Defer until the operation the job left running on the Connect server ends (its trigger renews this run's
        lease on its dataset's lock meanwhile)."""
        from imgest.operators.connect_job import detached_record, lock_of
        from imgest.operators.connect_trigger import SparkConnectOperationTrigger

        record = detached_record(self.job, extra)
        lock = lock_of(self.lock_dataset, context, self.state_conn_id)
        self.log.info("%s: deferred while operation %s runs %d partitions on Spark (this worker's slot is free)",
                      self.job, record["operation_id"], record["partitions"])  # fmt: skip
        trigger = SparkConnectOperationTrigger(master, record, self._conn_id, lock)
        deferrals = int(self._resumed.get("deferrals", 0)) + 1
        # the trigger's wait is bounded as the task is (a server that never answers again fails it into its retries)
        timeout = self.execution_timeout or DEFER_TIMEOUT
        self.defer(trigger=trigger, method_name="execute_complete", kwargs={"deferrals": deferrals}, timeout=timeout)

    def execute_complete(self, context: Any, event: dict[str, Any], deferrals: int = 1) -> Any:
        """Back from the triggerer: the job's operation ended; run the job's client again (it finds the partitions'
        results and goes on), or fail with the job's own error or a lost lock, its results folder removed."""
        from imgest.operators.connect_job import check_event, forget

        try:
            check_event(self.job, event)
        except Exception:
            forget(context, self.state_env())  # no client of this attempt runs again
            raise
        self._resumed = {**event, "deferrals": deferrals}
        return self.execute(context)

    def on_kill(self) -> None:
        proc = getattr(self, "_connect_proc", None)
        if proc is not None and proc.poll() is None:
            import signal

            os.killpg(proc.pid, signal.SIGTERM)
            return
        super().on_kill()

    def _fail_if_lock_lost(self) -> None:
        """After a failed job: LockLostError when the run lost its dataset's lock (a driver that found it lost
        published nothing, and retrying cannot give it back), else nothing (the job's own error stands)."""
        from imgest.core import locks

        if not self.lock_dataset:
            return
        try:
            locks.check_fence(self.lock_dataset)
        except locks.LockLostError:
            raise
        except Exception as exc:  # the store is away: the job's own error is the one to report
            self.log.warning("could not check the lock of %s after the job failed: %s", self.lock_dataset, exc)

    def _lease(self, context: Any) -> Any:
        """Hold this run's lease on its dataset's lock while the job runs (a job can outlast a lease): renewed,
        handed to the driver, and a lost lock failing the task without retries."""
        from contextlib import nullcontext

        from imgest.operators.state import run_lease

        if not self.lock_dataset:
            return nullcontext()
        ti = context.get("ti")
        return run_lease(self.dag_id, context["run_id"], self.lock_dataset, ti, aws_conn_id=self.state_conn_id)

    def _in_reused_driver(self, master: str, env: dict[str, str]) -> bool:
        """Run the job in the reused local driver when $IMGEST_SPARK_DRIVER_SOCKET names one (the test suite's,
        imgest.spark.driver_server) and the job would run there as submitted; True when it ran and succeeded."""
        import tempfile
        from pathlib import Path

        from airflow.sdk.exceptions import AirflowException

        from imgest.spark import driver_server
        from imgest.spark.conf import spark_conf
        from imgest.spark.submit import submit_command

        if driver_server.socket_path() is None or self.conf != spark_conf(master=master):
            return False
        with tempfile.TemporaryDirectory(prefix="imgest-job-") as tmp:
            out = Path(tmp) / "job.log"
            cmd = submit_command(self.job, [str(a) for a in self.application_args or []], master)
            rc = driver_server.submit(cmd, out, env)
            if rc is None:
                return False
            for line in out.read_text(errors="replace").splitlines():
                self.log.info("%s", line)
        if rc != 0:
            raise AirflowException(f"Cannot execute: {self.job} in the reused Spark driver. Error code is: {rc}.")
        return True


class CassandraIngestSubmitOperator(ImgestSparkSubmitOperator):
    """jobs/ingest_cassandra.py, reaching Cassandra through the `cassandra_default` connection."""

    job = "ingest_cassandra"

    def __init__(self, *, cassandra_conn_id: str = "cassandra_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cassandra_conn_id = cassandra_conn_id

    def job_env(self) -> dict[str, str]:
        from imgest.operators.hooks import ImgestCassandraHook

        hook = ImgestCassandraHook(self.cassandra_conn_id)
        settings = hook.settings()
        self.application_args = [
            *(self.application_args or []),
            *("--hosts", ",".join(settings.hosts), "--port", str(settings.port)),
        ]
        return hook.spark_env()


class PackShardsSubmitOperator(ImgestSparkSubmitOperator):
    """jobs/pack_shards.py, reaching S3 through the `aws_default` connection."""

    job = "pack_shards"

    def __init__(self, *, aws_conn_id: str = "aws_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.aws_conn_id = aws_conn_id

    def job_env(self) -> dict[str, str]:
        from imgest.operators.hooks import ImgestS3Hook

        return ImgestS3Hook(aws_conn_id=self.aws_conn_id).spark_env()


class VerifyShardsSubmitOperator(PackShardsSubmitOperator):
    """jobs/verify_shards.py: every shard of the published manifest.json read back and hashed on Spark's executors
    (imgest.spark.shard_verify), not in this worker; fails naming the mismatches. Returns the job's report (its XCom)
    where the driver wrote it on this host (client deploy mode, Spark Connect, a local master); where the driver ran
    elsewhere (cluster deploy mode), that the job found every shard as listed (its exit status), the report being in
    the driver's log."""

    job = "verify_shards"

    def execute(self, context: Any) -> dict[str, Any]:
        import json
        import tempfile
        from pathlib import Path

        args = list(self.application_args or [])
        with tempfile.TemporaryDirectory(prefix="imgest-verify-") as tmp:
            summary = Path(tmp) / "verify_shards.json"
            self.application_args = [*args, "--summary-json", str(summary)]
            try:
                super().execute(context)
            finally:
                self.application_args = args
            if summary.is_file():
                return json.loads(summary.read_text())
        self.log.info("the driver ran on another host: the verification's report is in its log")
        return {"ok": True, "report": "in the driver's log (it ran on another host)"}


class WriteFilesSubmitOperator(ImgestSparkSubmitOperator):
    """jobs/write_files.py: the files target needs no credentials (its folder is on shared storage)."""

    job = "write_files"
