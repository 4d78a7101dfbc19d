"""Operators of the refresh and check DAGs: finishing a refresh, checking a new version (the dataset lock:
``imgest.operators.dataset_lock``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator

from imgest.operators.base import RequestOperator

log = logging.getLogger(__name__)


def plan_target(
    conf: dict[str, Any], manifest_dir: str, cassandra_conn_id: str = "cassandra_default"
) -> dict[str, Any]:
    """The plan task of a refresh DAG's target: plan_refresh, with the Cassandra target's connection (where its
    ingest recorded each image's source sha256)."""
    from imgest.flow.refresh import plan_refresh
    from imgest.operators.hooks import ImgestCassandraHook

    cassandra = ImgestCassandraHook(cassandra_conn_id).settings() if conf.get("target") == "cassandra" else None
    return plan_refresh(conf, Path(manifest_dir), cassandra)


class FinishRefreshOperator(RequestOperator):
    """Apply what the Spark job leaves, verify the new version, move the refresh baseline forward. VERIFIED: the
    shards' report from the verify_shards job upstream (its XCom), which checked them on Spark's executors; the
    shards are then not read again in this worker."""

    template_fields = (*RequestOperator.template_fields, "verified")

    def __init__(self, *, verified: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.verified = verified

    def execute(self, context: Any) -> dict[str, Any]:
        from imgest.flow.refresh import finish_refresh
        from imgest.operators.state import run_lease

        request, cassandra, s3 = self.resolved()
        # records the version: fenced
        with run_lease(self.dag_id, context["run_id"], request["dataset"], context.get("ti")):
            return finish_refresh(request, Path(self.out_dir), cassandra, s3, self.verified)


class CheckVersionsOperator(BaseOperator):
    """For every dataset version announced through the `imgest-datasets` alias: DALI read-back of every reader
    of its target, and the xNVMe validation for the files target; reports recorded with the version.

    Each version is checked as a writer of its dataset: with the run state the request's deployment decides
    (``use_run_state``: the same store as the runs that write it), holding the dataset's lock (waiting for a
    writer that holds it) and fencing the record of its report; the lock is given back after each version."""

    def execute(self, context: Any) -> list[dict[str, Any]]:
        from imgest.flow.checks import versions_to_check

        results = [
            self._check(extra, context) for extra in versions_to_check(context.get("triggering_asset_events") or {})
        ]
        if not results:
            log.info("no unchecked version among the triggering asset events")
        return results

    def _check(self, extra: dict[str, Any], context: Any) -> dict[str, Any]:
        from imgest.core import locks
        from imgest.flow.checks import check_version
        from imgest.flow.request import IngestRequest
        from imgest.operators.dag_connections import DagConnections
        from imgest.operators.hooks import ImgestCassandraHook, lock_store, store_settings
        from imgest.operators.state import run_lease, use_run_state

        request, conns = IngestRequest.from_conf(extra["conf"]), DagConnections.from_extra(extra)  # its DAG's ids
        use_run_state([extra["conf"]], conns.cassandra, conns.spark)  # where its writers keep their lock and work files
        cassandra = ImgestCassandraHook(conns.cassandra).settings() if request.target == "cassandra" else None
        s3 = store_settings(request.shard_dest, conns.aws) if request.target == "shards" else None
        holder = locks.airflow_holder(self.dag_id, context["run_id"])
        store = lock_store(aws_conn_id=conns.aws, cassandra_conn_id=conns.cassandra)
        locks.acquire(
            request.dataset,
            holder,
            locks.default_wait(),
            on_wait=lambda other: log.info("%s is being written by %s: waiting", request.dataset, other.who),
            store=store,
        )
        try:
            ids = {"aws_conn_id": conns.aws, "cassandra_conn_id": conns.cassandra}
            with run_lease(self.dag_id, context["run_id"], request.dataset, context.get("ti"), **ids):
                return check_version(extra, cassandra, s3)
        finally:
            locks.release(request.dataset, holder, store)
