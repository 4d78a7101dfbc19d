"""SparkSubmitOperator for imgest's jobs: credentials go to the job's environment at execute time only."""

from __future__ import annotations

from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

JOB_NAMES = ("ingest_cassandra", "pack_shards")


class ImgestSparkSubmitOperator(SparkSubmitOperator):
    """Submit jobs/JOB.py on the `spark_default` connection.

    Credentials are read from the Airflow connection inside ``execute`` and handed to spark-submit as
    environment variables, after templates are rendered: they never appear in rendered fields, XCom,
    arguments or logs.
    """

    def __init__(self, *, job: str, credentials_conn_id: str | None = None, **kwargs: Any) -> None:
        from imgest.spark import JOBS_DIR

        if job not in JOB_NAMES:
            raise ValueError(f"unknown imgest job {job!r}; choose from {', '.join(JOB_NAMES)}")
        kwargs.setdefault("conn_id", "spark_default")
        kwargs.setdefault("name", f"imgest-{job}")
        super().__init__(application=str(JOBS_DIR / f"{job}.py"), **kwargs)
        self.job = job
        self.credentials_conn_id = credentials_conn_id

    def execute(self, context: Any) -> None:
        from imgest.spark import spark_conf, submit_env
        from operators.connections import cassandra_settings, s3_settings

        env = {
            k: v for k, v in submit_env().items() if k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_LOCAL_IP")
        }
        if self.job == "ingest_cassandra" and self.credentials_conn_id:
            settings = cassandra_settings(self.credentials_conn_id)
            if settings.username:
                env["IMGEST_CASSANDRA_USER"] = settings.username
                env["IMGEST_CASSANDRA_PASSWORD"] = settings.password or ""
            self.application_args = [
                *(self.application_args or []),
                "--hosts",
                ",".join(settings.hosts),
                "--port",
                str(settings.port),
            ]
        if self.job == "pack_shards" and self.credentials_conn_id:
            s3 = s3_settings(self.credentials_conn_id)
            env.update({"AWS_ACCESS_KEY_ID": s3.access_key or "", "AWS_SECRET_ACCESS_KEY": s3.secret_key or ""})
            if s3.endpoint_url:
                env["IMGEST_S3_ENDPOINT"] = s3.endpoint_url
        self.env_vars = {**(self.env_vars or {}), **env}
        self.conf = {**spark_conf(), **(self.conf or {})}
        super().execute(context)
