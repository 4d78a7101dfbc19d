"""Operator for the DAG's read_throughput task (imgest.flow.steps.read_throughput)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from imgest.operators.base import RequestOperator


class ReadThroughputOperator(RequestOperator):
    """Read the stored version back with every reader of its target (without imgest[dali], those that need no
    DALI, the others listed as skipped); fail on any byte or label mismatch."""

    def execute(self, context: Any) -> dict[str, Any]:
        from imgest.flow.steps import read_throughput
        from imgest.operators.state import run_lease

        request, cassandra, s3 = self.resolved()
        with run_lease(self.dag_id, context["run_id"], request["dataset"]):  # records its report: fenced
            return read_throughput(request, Path(self.out_dir), cassandra, s3)
