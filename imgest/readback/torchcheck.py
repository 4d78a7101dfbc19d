"""The PyTorch datasets (imgest[torch]) in the read-throughput check, beside webdataset's own loader.

A DataLoader with ``workers`` processes feeds the same DALI pipeline as every other reader
(``fn.external_source``), so images/s, the raw and train modes and the verification (sha256 and label of every
sample, each id once) are measured the same way. ``cpu_cores`` counts the reading process only, not the
DataLoader's worker processes: the settings say so.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from imgest.core.settings import CassandraSettings, S3Settings
from imgest.readback.datasets import ReadSet
from imgest.readback.measure import RunResult
from imgest.readback.pipelines import PipelineSpec
from imgest.readback.readers import ExternalBatch, run_external
from imgest.readback.resume import ReaderState

log = logging.getLogger(__name__)
WORKERS = 2


def loader_batches(loader: Iterable[dict[str, Any]]) -> Iterator[ExternalBatch]:
    """Batches of a DataLoader collated with ``torchdata.collate``, as external-source batches."""
    for batch in loader:
        images = [img.numpy() for img in batch["images"]]
        shas = [s or None for s in batch["sha256"]]
        yield images, batch["labels"].numpy().astype(np.int32), list(batch["ids"]), shas


def _run(name: str, rs: ReadSet, spec: PipelineSpec, dataset: Any, workers: int) -> RunResult:
    from torch.utils.data import DataLoader

    from imgest.readback.torchdata import collate

    loader = DataLoader(dataset, batch_size=spec.batch_size, num_workers=workers, collate_fn=collate)
    knobs = {"reader": f"torch DataLoader ({type(dataset).__name__})", "num_workers": workers}
    knobs["cpu_cores"] = "reading process only, not the DataLoader workers"
    return run_external(name, rs, spec, loader_batches(loader), knobs)


def torch_s3_run(
    rs: ReadSet, settings: S3Settings, location: str, spec: PipelineSpec, workers: int = WORKERS
) -> RunResult:
    """ShardDataset over the ReadSet's shards at LOCATION (s3://bucket/prefix)."""
    from imgest.readback.torchdata import ShardDataset

    dataset = ShardDataset(location, ReaderState(), shards=rs.shards, s3=settings)
    return _run("torch-shards-s3", rs, spec, dataset, workers)


def torch_cassandra_run(
    rs: ReadSet, settings: CassandraSettings, spec: PipelineSpec, workers: int = WORKERS, **options: Any
) -> RunResult:
    """CassandraDataset over the ReadSet's rows."""
    from imgest.readback.torchdata import CassandraDataset

    dataset = CassandraDataset(
        rs.table, rs.ids, rs.labels, ReaderState(), settings=settings, batch_size=spec.batch_size, **options
    )
    return _run("torch-cassandra", rs, spec, dataset, workers)


def torch_runs(
    sets: dict[str, ReadSet], s3_location: str, cassandra: CassandraSettings, s3: S3Settings, opts: Any
) -> list[RunResult]:
    """The torch datasets over S3 shards and Cassandra, each mode of OPTS (a ReadCheckOptions)."""
    results = []
    for mode in opts.modes:
        results.append(torch_s3_run(sets["s3"], s3, s3_location, opts.spec(mode)))
        results.append(torch_cassandra_run(sets["cassandra"], cassandra, opts.spec(mode)))
    return results
