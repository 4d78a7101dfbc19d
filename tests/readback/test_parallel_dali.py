"""DALI's webdataset reader as several pipelines read as one (imgest.readback.parallel): over shards in a folder and
on the real S3 server, every sample of the split comes exactly once, verified against its recorded sha256 and
label, whatever the number of pipelines (parts of unequal size included: 60 samples over 7 pipelines)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from imgest.core import defaults
from imgest.core.settings import S3Settings
from imgest.readback.dali_s3 import dali_s3_env
from imgest.readback.datasets import shards_set
from imgest.readback.pipelines import PipelineSpec, dali_available
from imgest.readback.readers import run_webdataset
from imgest.sinks.shards.store import open_store

pytestmark = [pytest.mark.services, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _dali() -> None:
    if not dali_available():
        pytest.skip("DALI's readers are what this test reads with: pip install 'imgest[dali]'")


@pytest.mark.parametrize("readers", [1, 2, 7])
@pytest.mark.parametrize("mode", ["raw", "train"])
def test_parallel_pipelines_read_every_sample_once_from_a_folder(
    stored: dict[str, Any], readers: int, mode: str
) -> None:
    rs = shards_set(open_store(str(stored["shards"])))
    result = run_webdataset("shards-folder", rs, PipelineSpec(4, 1, mode), str(stored["shards"]), readers=readers)
    assert result.ok, result.problems
    assert result.images == result.images_verified == stored["train"]
    assert result.settings["readers"] == readers


def test_parallel_pipelines_read_every_sample_once_from_s3(stored: dict[str, Any]) -> None:
    settings: S3Settings = stored["s3_settings"]
    rs = shards_set(open_store(stored["s3"], settings))
    with dali_s3_env(settings):
        result = run_webdataset("shards-s3-dali", rs, PipelineSpec(4, 1, "raw"), stored["s3"], readers=3)
    assert result.ok, result.problems
    assert result.images == result.images_verified == stored["train"]
    assert result.settings["readers"] == 3


def test_the_checks_dali_s3_reader_reads_every_sample_once_over_shuffled_blocks(
    stored: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check's DALI s3:// reader (s3_dali_run) reads the shards as 5-sample blocks, each an index file of its own
    beside the same tar on S3, in a shuffled order: still every sample exactly once, verified."""
    from imgest.core import defaults
    from imgest.readback.blocks import index_reader, parse_index
    from imgest.readback.dali_s3 import s3_dali_run
    from imgest.readback.readers import shard_indexes

    monkeypatch.setattr(defaults, "CHECK_DALI_S3_BLOCK", 5)
    settings: S3Settings = stored["s3_settings"]
    store = open_store(stored["s3"], settings)
    rs = shards_set(store)
    sizes = [len(parse_index(index_reader(store)(i), i)[1]) for i in shard_indexes(rs)]
    assert len(sizes) > 1
    assert sum(sizes) == stored["train"]
    result = s3_dali_run(rs, settings, stored["s3"], PipelineSpec(4, 1, "raw"))
    assert result.ok, result.problems
    assert result.images == result.images_verified == stored["train"]
    assert result.settings["blocks"] == sum(-(-n // 5) for n in sizes)
    assert result.settings["readers"] == defaults.CHECK_DALI_S3_READERS
    # it read in a process of its own (imgest.readback.dali_s3_process), killed once its result came: not this one
    assert result.settings["process"] != os.getpid()
    with pytest.raises(ProcessLookupError):
        os.kill(result.settings["process"], 0)


def test_a_cut_dali_s3_reader_says_how_many_images_it_read_and_why(
    stored: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its share spent after its warm-up and window (1 + 1 batches of 4 per pipeline here, of 60 images, no least
    window: its 60 images take a fraction of a second): the result is cut, its reason gives the images read of the
    sample, why it stopped and why this reader is slow."""
    monkeypatch.setitem(defaults.CHECK_LEAST_WINDOW_S, ("shards-s3-dali", "raw"), 0.0)
    from imgest.readback.budget import SHARE_SPENT, ReaderBudget
    from imgest.readback.dali_s3 import DALI_S3_NOTE, s3_dali_run

    settings: S3Settings = stored["s3_settings"]
    rs = shards_set(open_store(stored["s3"], settings))
    budget = ReaderBudget(seconds=0.001, warmup=1, window=1, stop_when_steady=False)
    result = s3_dali_run(rs, settings, stored["s3"], PipelineSpec(1, 1, "raw"), budget=budget)
    assert result.ok, result.problems
    assert result.budget_cut
    assert result.stop == SHARE_SPENT
    assert result.images == result.images_verified < stored["train"]
    assert result.unread == stored["train"] - result.images
    assert result.reason.startswith("its 0.0 s share was spent at ")
    assert f": read {result.images} of the {stored['train']} images of the sample; " in result.reason
    assert result.reason.endswith(DALI_S3_NOTE)
    assert "a slow reader's bounded sample: its start-up, 1 warm-up and 1 measured batches took" in result.reason
