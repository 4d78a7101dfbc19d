"""Operator for the DAG's read_throughput task (imgest.flow.steps.read_throughput)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from imgest.operators.base import RequestOperator


def _since(started: Any) -> float | None:
    if not isinstance(started, datetime):
        return None
    if started.tzinfo is None:  # Airflow keeps its times in UTC
        started = started.replace(tzinfo=UTC)
    return max(0.0, (datetime.now(UTC) - started).total_seconds())


def run_seconds(context: Any) -> float | None:
    """Seconds since the task's DAG run started (None when the context has no run or no start): what the read-back
    check's share of the run is measured against."""
    return _since(getattr(context.get("dag_run"), "start_date", None))


def task_seconds(context: Any) -> float:
    """Seconds this task instance has run so far (its start-up: the run's share counts the whole task); 0 unknown."""
    return _since(getattr(context.get("ti"), "start_date", None)) or 0.0


class ReadThroughputOperator(RequestOperator):
    """Read the stored version back with every reader of its target (without imgest[dali], those that need no
    DALI, the others listed as skipped), within the request's check_seconds and, from 100,000 train images on, a
    share of the run so far; each reader's start-up and steady rate apart; fail on any byte or label mismatch."""

    def execute(self, context: Any) -> dict[str, Any]:
        from imgest.flow.steps import read_throughput
        from imgest.operators.state import run_lease

        request, cassandra, s3 = self.resolved()
        # records its report: fenced
        with run_lease(self.dag_id, context["run_id"], request["dataset"], context.get("ti")):
            spent = task_seconds(context)
            return read_throughput(request, Path(self.out_dir), cassandra, s3, run_seconds(context), spent)
