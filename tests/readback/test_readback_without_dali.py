"""The read_throughput step where DALI is not installed (issue #52), against the real S3 and Cassandra: the readers
that feed no DALI reader of their own (imgest's S3 stream and webdataset's loader; imgest's two Cassandra readers)
read and verify every stored train image in raw mode, and DALI's reader and every train mode are listed as skipped.
"Not installed" is an import that fails in this process (tests/unit/test_optional_extras.py's not_installed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from imgest.readback.check import ReadCheckOptions
from imgest.readback.step import read_throughput_step
from tests.readback.conftest import step_settings
from tests.unit.test_optional_extras import NO_DALI, not_installed

pytestmark = [pytest.mark.services, pytest.mark.slow]
OPTS = ReadCheckOptions(sample=0, batch_size=8, num_threads=1)


def _read(out: dict[str, Any]) -> list[tuple[str, str, int, bool]]:
    report = json.loads(Path(out["report"]).read_text())
    assert report["checked"] == out["checked"]
    return [(r["reader"], r["mode"], r["images"], r["ok"]) for r in report["readers"]]


def test_s3_shards_and_cassandra_read_back_without_dali(stored: dict[str, Any], tmp_path: Path) -> None:
    with not_installed("nvidia.dali"):
        shards = read_throughput_step("shards", stored["s3"], tmp_path / "s3", step_settings(stored), OPTS)
        rows = read_throughput_step("cassandra", "", tmp_path / "cassandra", step_settings(stored), OPTS)
    train = stored["train"]
    assert shards["checked"] == rows["checked"] == train  # every stored train image, its sha256 and label
    assert _read(shards) == [("shards-s3-stream", "raw", train, True), ("shards-s3-webdataset", "raw", train, True)]
    assert shards["skipped"] == [
        f"shards-s3-dali (raw): {NO_DALI}",
        f"shards-s3-dali (train): {NO_DALI}",
        f"shards-s3-stream (train): {NO_DALI}",
        f"shards-s3-webdataset (train): {NO_DALI}",
    ]
    assert _read(rows) == [("cassandra", "raw", train, True), ("cassandra-simple", "raw", train, True)]
    assert rows["skipped"] == [f"cassandra (train): {NO_DALI}", f"cassandra-simple (train): {NO_DALI}"]
    assert Path(shards["plot"]).read_bytes().startswith(b"\x89PNG")  # matplotlib is still here
