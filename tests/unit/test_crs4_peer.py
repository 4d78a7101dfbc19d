"""The cassandra-dali-plugin peer's pure parts: presets, its scripts' configuration, adoption's table names, and
the out-of-order tally check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from imgest.core.settings import CassandraSettings
from imgest.peers.crs4_reader import PRESETS, check_tally, crs4_reader_args
from imgest.peers.crs4_scripts import private_data
from imgest.readback.datasets import ReadSet
from imgest.sinks.cassandra.adopt import AdoptError, layout_of


def test_lfn_preset_is_the_plugins_published_one() -> None:
    lfn = PRESETS["lfn"]
    assert (lfn.prefetch_buffers, lfn.io_threads, lfn.comm_threads, lfn.copy_threads) == (16, 8, 1, 4)
    assert (lfn.ooo, lfn.slow_start) == (True, 4)
    args = crs4_reader_args(
        CassandraSettings(hosts=("10.0.0.5",), port=9142), "ks.data", ["6A2F41A3-C54C-4BC8-8E2A-3C2F6C2C2C2C"], lfn
    )
    assert args["source_uuids"] == ["6a2f41a3-c54c-4bc8-8e2a-3c2f6c2c2c2c"]
    assert (args["cassandra_port"], args["table"], args["prefetch_buffers"]) == (9142, "ks.data", 16)


def test_private_data_points_the_scripts_at_the_settings() -> None:
    text = private_data(CassandraSettings(hosts=("10.0.0.5",), port=9142, username="u", password="p'w"))
    scope: dict[str, object] = {}
    exec(text.replace("from crs4.cassandra_utils import CassandraConf", "class CassandraConf: pass"), scope)
    conf = scope["cass_conf"]
    assert (conf.cassandra_ips, conf.cassandra_port, conf.username, conf.password) == (["10.0.0.5"], 9142, "u", "p'w")
    assert conf.use_ssl is False


@pytest.mark.parametrize(
    ("data", "meta", "layout", "split"),
    [("ks.data", "ks.metadata", "split-column", None), ("ks.data_train", "ks.metadata_train", "per-split", "train")],
)
def test_adoption_accepts_imgest_table_names(data: str, meta: str, layout: str, split: str | None) -> None:
    tables, got = layout_of(data, meta)
    assert (tables.keyspace, tables.layout, got) == ("ks", layout, split)


@pytest.mark.parametrize(
    ("data", "meta", "match"),
    [("ks.data", "other.metadata", "different keyspaces"), ("ks.images", "ks.meta", "data_<split>")],
)
def test_adoption_names_what_is_wrong_with_table_names(data: str, meta: str, match: str) -> None:
    with pytest.raises(AdoptError, match=match):
        layout_of(data, meta)


def _set(n: int) -> ReadSet:
    ids = np.array([f"{i:036d}".encode() for i in range(n)])
    return ReadSet("cassandra", "ks.data", {"id": ids, "label": np.zeros(n, np.int32)})


def test_tally_allows_the_epoch_boundary_blur_and_nothing_more() -> None:
    rs = _set(4)
    assert check_tally(rs, np.array([3, 2, 3, 4]), 3) == []
    problems = check_tally(rs, np.array([5, 1, 3, 3]), 3)
    assert any("more than 4" in p for p in problems)
    assert any("fewer than 2" in p for p in problems)
    assert check_tally(rs, np.array([5, 1, 3, 3]), 3, blur=2) == []
    assert check_tally(rs, np.array([3, 3, 3, 2]), 3) == ["11 samples verified in 3 epochs of 4 rows"]


def test_bench_plugin_names_what_it_cannot_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from imgest.cli import main

    assert main(["bench", "plugin", "--json", str(tmp_path / "x.json"), "--parts", "readers,bogus"]) == 1
    err = capsys.readouterr().err
    assert "readers, sweep, loop-read, writers" in err or "make install-peers" in err
    assert not (tmp_path / "x.json").exists()
