"""imgest's section of Airflow's configuration, ``[imgest]``: the settings a deployment gives its DAGs and tasks, listed
by ``airflow config list`` (the provider record's ``config``) and set in airflow.cfg or as ``AIRFLOW__IMGEST__<NAME>``.

Each option stands for one of the ``IMGEST_*`` variables imgest reads, which are still honoured and win over it: a
task (``export_section``, run by every imgest DAG task before it executes) and a DAG file's parse (before it builds
its DAGs) export the section's non-empty values as the variables that are not set. Imports nothing: the provider
record reads it at Airflow's start-up.
"""

from __future__ import annotations

import os
from typing import Any

SECTION = "imgest"
VERSION_ADDED = "0.1.0"  # the package version that added the section

# option -> (variable, type, example, description)
OPTIONS: dict[str, tuple[str, str, str, str]] = {
    "state_url": (
        "IMGEST_STATE_URL",
        "string",
        "s3://imgest-state/prod",
        "Where runs keep their state (work folders, dataset locks, staging) when tasks run on several hosts; empty: "
        "beside the run's S3 destination (s3://<its bucket>/_imgest-state), or `local` for this host's state folder.",
    ),
    "datasets_file": (
        "IMGEST_DATASETS_FILE",
        "string",
        "/opt/airflow/imgest/datasets.toml",
        "The datasets file whose entries become refresh_<name> DAGs; empty: $IMGEST_HOME/datasets.toml.",
    ),
    "shared_mounts": (
        "IMGEST_SHARED_MOUNTS",
        "string",
        "/mnt/datasets,/mnt/out",
        "Local folders every task host and Spark node mounts (comma separated): a local source or files target "
        "elsewhere is refused on a deployment across hosts.",
    ),
    "spark_pool": (
        "IMGEST_SPARK_POOL",
        "string",
        "spark",
        "The Airflow pool of the DAGs' Spark jobs (its slots: the jobs the cluster runs at once); empty: "
        "default_pool. A DAG factory's spark_pool wins.",
    ),
    "spark_pyenv": (
        "IMGEST_SPARK_PYENV",
        "string",
        "/opt/imgest-env.tar.gz",
        "A packed Python environment (conda-pack or venv-pack) shipped to executors that lack imgest's.",
    ),
    "k8s_secret": (
        "IMGEST_K8S_SECRET",
        "string",
        "imgest-job-secrets",
        "The Kubernetes Secret a spark-submit job in cluster deploy mode on a k8s:// master takes its secrets from "
        "(spark.kubernetes.driver.secretKeyRef.*; keys: the variables' names in lower case, '-' for '_').",
    ),
    "executor_python": (
        "IMGEST_EXECUTOR_PYTHON",
        "string",
        "/opt/venv/bin/python",
        "The Python the Spark executors run (PYSPARK_PYTHON); empty: the driver's.",
    ),
    "spark_java_options": (
        "IMGEST_SPARK_JAVA_OPTIONS",
        "string",
        "-XX:+UseG1GC",
        "More JVM options for the Spark driver and executors.",
    ),
    "lock_wait_s": (
        "IMGEST_LOCK_WAIT_S",
        "integer",
        "3600",
        "How long a run waits for another writer's lock on its dataset before it fails; empty: 6 hours.",
    ),
    "lock_deferrable": (
        "IMGEST_LOCK_DEFERRABLE",
        "boolean",
        "0",
        "A run that finds its dataset's lock held waits deferred to the triggerer, its worker slot free; 0: it waits "
        "in the worker (a deployment without a triggerer). Empty: 1.",
    ),
    "spark_deferrable": (
        "IMGEST_SPARK_DEFERRABLE",
        "boolean",
        "1",
        "Through a Spark Connect master, a Spark job's task defers to the triggerer while Spark runs its partitions "
        "(no process of it on the worker, its slot free); its results wait in the state store (IMGEST_STATE_URL; "
        "else the local state folder: one machine). Empty: 0.",
    ),
    "lock_lease_s": (
        "IMGEST_LOCK_LEASE_S",
        "integer",
        "600",
        "The lease of a dataset lock: a holder that stops renewing it loses it after this many seconds.",
    ),
    "workarea_ephemeral": (
        "IMGEST_WORKAREA_EPHEMERAL",
        "boolean",
        "1",
        "1: each task starts with an empty work folder (pods without a shared disk); the state store carries it.",
    ),
    "home": (
        "IMGEST_HOME",
        "string",
        "/var/lib/imgest",
        "imgest's state folder on each host (work folders, caches); empty: ~/.imgest.",
    ),
    "jvm_cds": (
        "IMGEST_JVM_CDS",
        "boolean",
        "0",
        "0 turns off the class-data-sharing archives of the JVMs imgest starts.",
    ),
}


def provider_config() -> dict[str, Any]:
    """The provider record's ``config``: the section with every option (default empty: the variable's own default)."""
    options = {
        name: {
            "description": f"{text} (the variable {env} wins)",
            "version_added": VERSION_ADDED,
            "type": kind,
            "example": example,
            "default": "",
        }
        for name, (env, kind, example, text) in OPTIONS.items()
    }
    return {
        SECTION: {"description": "imgest's settings for its DAGs and tasks (docs/configuration.md)", "options": options}
    }


def export_section(environ: Any = None) -> dict[str, str]:
    """Export the ``[imgest]`` section's non-empty values as the IMGEST_* variables ENVIRON (os.environ) lacks;
    returns what it set. Outside Airflow (no airflow package), nothing."""
    environ = os.environ if environ is None else environ
    try:
        from airflow.configuration import conf
    except ImportError:
        return {}
    done = {}
    for name, (env, *_rest) in OPTIONS.items():
        if environ.get(env):
            continue
        value = str(conf.get(SECTION, name, fallback="") or "").strip()
        if value:
            environ[env] = done[env] = value
    return done
