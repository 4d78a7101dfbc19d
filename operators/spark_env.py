"""How a spark-submit job gets its settings and secrets, by master and deploy mode, never on a command line.

The Spark provider turns an operator's ``env_vars`` into ``--conf spark.kubernetes.driverEnv.K=V`` (Kubernetes) or
``--conf spark.yarn.appMasterEnv.K=V`` (YARN): every value, passwords and keys included, on spark-submit's command
line and in the task log, and on Kubernetes in client mode the local driver then gets none of them. imgest's
operators never hand ``env_vars`` to the provider:

- **client mode** (the driver is spark-submit's own process, on the Airflow worker: every master): the variables go
  into the task process's environment, which spark-submit inherits; nothing on its command line;
- **cluster mode on Kubernetes**: the plain settings go as ``spark.kubernetes.driverEnv.*``; each secret as
  ``spark.kubernetes.driver.secretKeyRef.<VAR>=<secret>:<key>``, a reference to a Kubernetes Secret the platform
  keeps (``[imgest] k8s_secret`` / ``IMGEST_K8S_SECRET`` names it; its keys are the variables' names in lower case
  with ``-`` for ``_``): the value never leaves the cluster's Secret;
- **cluster mode on YARN**: YARN has no secret reference a submission can name; a job with secrets is refused with
  the ways that keep them off the command line (client mode, or Spark Connect).
"""

from __future__ import annotations

import re

from imgest.core.errors import ConfigError

SECRET = re.compile(r"(?i)secret|password|token|access_key|key_id|_key_pem")
K8S_SECRET_ENV = "IMGEST_K8S_SECRET"


def is_secret(name: str) -> bool:
    """NAME is a variable whose value must stay off command lines, logs and Spark's configuration."""
    return bool(SECRET.search(name))


def secret_key(name: str) -> str:
    """The key of variable NAME in the platform's Kubernetes Secret (lower case, '-' for '_')."""
    return name.lower().replace("_", "-")


def route_env(
    master: str, deploy_mode: str, env: dict[str, str], k8s_secret: str = ""
) -> tuple[dict[str, str], dict[str, str]]:
    """(Spark settings, the task process's variables) that carry ENV to a job on MASTER in DEPLOY_MODE; secrets
    appear in neither as values on any route but client mode's process environment."""
    if deploy_mode != "cluster":
        return {}, dict(env)
    secrets = sorted(k for k in env if is_secret(k))
    plain = {k: v for k, v in env.items() if not is_secret(k)}
    if master.startswith("k8s://"):
        if secrets and not k8s_secret:
            keys = ", ".join(secret_key(k) for k in secrets)
            raise ConfigError(
                f"cluster deploy mode on Kubernetes: the job's secrets ({', '.join(secrets)}) go to the driver pod "
                f"only as references to a Kubernetes Secret; create one holding the keys {keys} and name it in "
                f"[imgest] k8s_secret (or {K8S_SECRET_ENV}), or submit in client mode"
            )
        confs = {f"spark.kubernetes.driverEnv.{k}": v for k, v in plain.items()}
        confs |= {f"spark.kubernetes.driver.secretKeyRef.{k}": f"{k8s_secret}:{secret_key(k)}" for k in secrets}
        return confs, {}
    if master.startswith("yarn"):
        if secrets:
            raise ConfigError(
                f"cluster deploy mode on YARN would put the job's secrets ({', '.join(secrets)}) on spark-submit's "
                "command line (spark.yarn.appMasterEnv.*): submit in client mode (the driver on the Airflow worker "
                "gets them in its environment) or through Spark Connect"
            )
        return {f"spark.yarn.appMasterEnv.{k}": v for k, v in plain.items()}, {}
    raise ConfigError(
        f"cluster deploy mode on {master}: a standalone or local master's cluster mode takes no driver environment; "
        "submit in client mode"
    )
