"""A reader whose whole sample ends before its least window reads it again (imgest.readback.passes), against the
real services: the Cassandra reader (its window carries over) and the S3 stream reader, every pass verified."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from imgest.core import defaults
from imgest.readback import passes
from imgest.readback.check import ReadCheckOptions, cassandra_runs
from imgest.readback.check_s3 import s3_stream_run
from imgest.readback.datasets import cassandra_set, shards_set
from imgest.readback.measure import RunResult
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sinks.cassandra.schema import TableLayout
from imgest.sinks.shards.store import open_store
from tests.readback.conftest import DATASET, KEYSPACE

pytestmark = [pytest.mark.services, pytest.mark.slow]
OPTS = ReadCheckOptions(batch_size=4, modes=("raw",))  # 60 images: 2 warm-up batches and 13 measured


def _settled(once: RunResult, again: RunResult, n: int, least: float) -> None:
    assert once.passes == 1
    assert once.images == n
    assert once.ok
    assert again.ok, again.problems  # every pass verified: ids, labels, sha256
    assert again.passes >= 2
    assert again.settings["passes"] == again.passes
    assert again.images == again.passes * n
    assert again.images_verified == n
    assert again.stop == f"sample read {again.passes} times"
    assert again.steady
    assert again.steady_s >= least
    assert again.least_window_s == least
    assert again.steady_rate == pytest.approx(again.steady_images / again.steady_s, abs=0.2)


def test_the_cassandra_reader_reads_a_short_sample_again(stored: dict[str, Any], monkeypatch: Any) -> None:
    with cassandra_session(stored["cassandra"]) as session:
        rs = cassandra_set(session, TableLayout(KEYSPACE), DATASET)
    once = cassandra_runs(stored["cassandra"], rs, OPTS, baseline=False)[0]
    least = 3 * once.steady_s  # its reads of 60 rows span milliseconds: a least window of three of them
    monkeypatch.setitem(defaults.CHECK_LEAST_WINDOW_S, ("cassandra", "raw"), least)
    monkeypatch.setattr(passes, "MAX_PASSES", 50)  # however fast the later passes
    again = cassandra_runs(stored["cassandra"], rs, replace(OPTS, settle=True), False)[0]
    _settled(once, again, len(rs), least)
    assert again.settings["window"]  # one reader over the passes: its window recorded


def test_the_s3_stream_reader_reads_a_short_sample_again(stored: dict[str, Any], monkeypatch: Any) -> None:
    s3 = stored["s3_settings"]
    rs = shards_set(open_store(stored["s3"], s3))
    spec = OPTS.spec("raw")
    once = s3_stream_run(rs, s3, "imgest", "tests/readback", spec, OPTS.s3)
    least = 3 * once.steady_s
    monkeypatch.setitem(defaults.CHECK_LEAST_WINDOW_S, ("shards-s3-stream", "raw"), least)
    monkeypatch.setattr(passes, "MAX_PASSES", 50)
    again = s3_stream_run(rs, s3, "imgest", "tests/readback", spec, OPTS.s3, settle=True)
    _settled(once, again, len(rs), least)
