"""Operator for the DAG's validate_xnvme task (imgest.validate.step.validate_xnvme_step)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator


class ValidateXnvmeOperator(BaseOperator):
    """Read the files dataset back with DALI's reader, the Python file API and xNVMe's file and block APIs; fail
    when any engine reads a byte or label that differs from the ingest record. Returns the report's summary.
    Without imgest[dali], DALI's reader is skipped with the reason and the other engines are still compared.

    SAMPLE images of each split are read, a seeded class-balanced sample (0: every image; None: the default)."""

    template_fields: Sequence[str] = ("dataset_dir", "out_dir", "loop_fs", "sample")

    def __init__(
        self,
        *,
        dataset_dir: str,
        out_dir: str,
        loop_fs: str | None = None,
        sample: int | str | None = None,
        batch_size: int | None = None,
        queue_depth: int | None = None,
        sweep: list[int] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.dataset_dir, self.out_dir, self.loop_fs, self.sample = dataset_dir, out_dir, loop_fs, sample
        self.batch_size, self.queue_depth, self.sweep = batch_size, queue_depth, sweep

    def execute(self, context: Any) -> dict[str, Any]:
        from imgest.validate.check import CheckConfig
        from imgest.validate.step import validate_xnvme_step

        sample = None if self.sample in (None, "") else int(self.sample)  # 0: every image
        knobs = {"batch_size": self.batch_size, "queue_depth": self.queue_depth, "sample": sample}
        config = CheckConfig(**{k: v for k, v in knobs.items() if v is not None})
        return validate_xnvme_step(
            Path(self.dataset_dir), Path(self.out_dir), config=config, loop_fs=self.loop_fs or None, sweep=self.sweep
        )
