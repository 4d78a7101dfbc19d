"""Operator that writes the split file of a finished ingest (imgest.flow.steps.build_split)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from imgest.operators.base import RequestOperator


class BuildSplitOperator(RequestOperator):
    """Split the train rows of the ingested dataset into parts; writes split-<target>.npz."""

    def execute(self, context: Any) -> dict[str, Any]:
        from imgest.flow.steps import build_split

        request, cassandra, s3 = self.resolved()
        return build_split(request, Path(self.out_dir), cassandra, s3)
