"""cassandra-dali-plugin side by side: its reader and its own scripts against imgest's tables, and the reverse.

The plugin is built by ``make install-peers`` (scripts/build_crs4_plugin.sh); its example scripts run as they
ship, with only the ``private_data.py`` they import written to point at the test node.
"""

from __future__ import annotations

import collections
import hashlib
import math
import pickle
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from imgest.cli import main as cli
from imgest.peers import crs4
from imgest.peers.crs4_scripts import plugin_tables_cql, prepare_examples, run_example
from imgest.readback.check import ReadCheckOptions, cassandra_runs
from imgest.readback.datasets import NotReadableError, cassandra_set
from imgest.readback.pipelines import PipelineSpec
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sinks.cassandra.schema import TableLayout
from tests.readback.conftest import DATASET, KEYSPACE

pytestmark = [pytest.mark.services, pytest.mark.slow]
PLUGIN_KS = "imgest_crs4_plugin_test"  # the keyspace the plugin's own writer fills


@pytest.fixture(scope="module", autouse=True)
def _plugin() -> None:
    if not crs4.available():
        pytest.skip(f"cassandra-dali-plugin is not installed: {crs4.INSTALL_HINT}")


@pytest.fixture(scope="module")
def examples(stored: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare_examples(tmp_path_factory.mktemp("crs4"), stored["cassandra"])


@pytest.fixture(scope="module")
def crs4_split(stored: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`imgest split --format crs4` over the stored version (train and val rows, 8:2)."""
    out = tmp_path_factory.mktemp("split") / "split.npz"
    argv = ["split", "--data-table", f"{KEYSPACE}.data", "--metadata-table", f"{KEYSPACE}.metadata"]
    argv += ["--dataset", DATASET, "--port", str(stored["cassandra"].port), "-r", "8,2", "--seed", "4"]
    assert cli([*argv, "-o", str(out), "--format", "crs4"]) == 0
    return out.with_suffix(".pckl")


def _recorded(stored: dict[str, Any]) -> dict[str, tuple[int, str]]:
    """id -> (label, sha256) of every row of the stored version, from imgest's metadata table."""
    with cassandra_session(stored["cassandra"]) as session:
        rows = session.execute(f"SELECT id, label, sha256, dataset FROM {KEYSPACE}.metadata")
        return {str(r.id): (r.label, r.sha256) for r in rows if r.dataset == DATASET}


def _plugin_read(stored: dict[str, Any], table: str, ids: list[str], batch: int) -> list[tuple[int, str]]:
    """(label, sha256) of every sample fn.crs4.cassandra returns for one epoch over IDS (in-order preset)."""
    from imgest.peers.crs4_reader import PRESETS, crs4_pipeline, crs4_reader_args

    args = crs4_reader_args(stored["cassandra"], table, ids, PRESETS["defaults"])
    pipe = crs4_pipeline(PipelineSpec(batch, mode="raw"), args)
    got: list[tuple[int, str]] = []
    for _ in range(math.ceil(len(ids) / batch)):
        jpegs, labels = pipe.run()
        for i in range(len(jpegs)):
            got.append((int(np.asarray(labels.at(i)).ravel()[0]), hashlib.sha256(jpegs.at(i).tobytes()).hexdigest()))
    return got[: len(ids)]  # the last batch is padded with copies of the epoch's last row


def test_plugin_reader_reads_our_table_for_each_part_of_our_split(stored: dict[str, Any], crs4_split: Path) -> None:
    with open(crs4_split, "rb") as f:  # as the plugin's training scripts load it
        split = pickle.load(f)
    recorded = _recorded(stored)
    assert split["data_table"] == f"{KEYSPACE}.data"
    assert sum(len(p) for p in split["split"]) == len(recorded) == stored["train"] + 6
    for part in split["split"]:
        ids = [str(u) for u in split["row_keys"][part]]
        got = _plugin_read(stored, split["data_table"], ids, batch=7)
        assert collections.Counter(got) == collections.Counter(recorded[i] for i in ids)


@pytest.mark.parametrize("preset", ["defaults", "lfn"])
def test_plugin_reader_reads_back_exactly_through_imgest_pipelines(stored: dict[str, Any], preset: str) -> None:
    from imgest.peers.crs4_reader import PRESETS, crs4_epochs

    with cassandra_session(stored["cassandra"]) as session:
        rs = cassandra_set(session, TableLayout(KEYSPACE), DATASET)
    for mode in ("raw", "train"):
        results = crs4_epochs(stored["cassandra"], rs, PipelineSpec(6, mode=mode), PRESETS[preset], epochs=3)
        assert [r.images for r in results] == [len(rs)] * 3
        for r in results:
            assert r.ok, (preset, mode, r.problems)
            assert (r.settings["preset"], r.settings["ooo"]) == (preset, PRESETS[preset].ooo)


def test_plugin_split_loop_read_consumes_our_split_file(examples: Path, crs4_split: Path) -> None:
    with open(crs4_split, "rb") as f:
        sizes = [len(p) for p in pickle.load(f)["split"]]
    for index, size in enumerate(sizes):
        run = run_example(examples, "splitfile", "loop_read.py", [str(crs4_split), "--use-index", str(index)])
        assert run.returncode == 0, run.stderr[-3000:]
        steps = math.ceil(size / 128)  # the script's batch size
        assert run.stderr.count(f"{steps}/{steps}") >= 10, run.stderr[-2000:]  # its 10 epochs, each complete


def test_plugin_cache_uuids_and_loop_read_on_our_tables(stored: dict[str, Any], examples: Path) -> None:
    rows = examples / "imagenette" / "ours.rows"
    table = ["--metadata-table", f"{KEYSPACE}.metadata", "--rows-fn", str(rows)]
    run = run_example(examples, "imagenette", "cache_uuids.py", table)
    assert run.returncode == 0, run.stderr[-3000:]
    with open(rows, "rb") as f:
        cached = {str(u) for u in pickle.load(f)["row_keys"]}
    assert cached == set(_recorded(stored))
    argv = ["--data-table", f"{KEYSPACE}.data", "--rows-fn", str(rows), "--epochs", "4", "--bs", "16"]
    run = run_example(examples, "imagenette", "loop_read.py", argv)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Average speed:" in run.stdout, run.stdout[-2000:]  # its statistics over epochs 2-4


def test_plugin_extract_serial_keyspace_is_named_then_adopted(
    stored: dict[str, Any], examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reverse direction: the plugin's own writer fills a keyspace, imgest says what it lacks, then adopts it."""
    settings = stored["cassandra"]
    src = stored["root"] / "src"
    with cassandra_session(settings) as session:
        session.execute(f"DROP KEYSPACE IF EXISTS {PLUGIN_KS}", timeout=60)
        for statement in plugin_tables_cql(examples, PLUGIN_KS):
            session.execute(statement, timeout=60)
    tables = ["--data-table", f"{PLUGIN_KS}.data_train", "--metadata-table", f"{PLUGIN_KS}.metadata_train"]
    run = run_example(examples, "common", "extract_serial.py", [str(src), "--split-subdir=train", *tables])
    assert run.returncode == 0, run.stderr[-3000:]

    with pytest.raises(NotReadableError, match="imgest adopt crs4"), cassandra_session(settings) as session:
        cassandra_set(session, TableLayout(PLUGIN_KS, layout="per-split"), "plugin")
    port = ["--port", str(settings.port)]
    capsys.readouterr()
    assert cli(["split", *tables, *port, "-o", str(stored["root"] / "plugin.npz")]) == 1
    assert "imgest adopt crs4" in capsys.readouterr().err  # says what is missing and what to run

    assert cli(["adopt", "crs4", *tables, *port, "--dataset", "plugin"]) == 0
    assert cli(["adopt", "crs4", *tables, *port, "--dataset", "plugin"]) == 0  # a rerun: the same version, complete
    with cassandra_session(settings) as session:
        rs = cassandra_set(session, TableLayout(PLUGIN_KS, layout="per-split"), "plugin")
        versions = list(session.execute(f"SELECT status FROM {PLUGIN_KS}.dataset_versions"))
        meta = session.execute(f"SELECT or_label, label FROM {PLUGIN_KS}.metadata_train")
        names = {r.or_label: r.label for r in meta}
    assert [v.status for v in versions] == ["complete"]
    assert len(rs) == stored["train"]
    results = cassandra_runs(settings, rs, ReadCheckOptions(batch_size=8))
    assert {r.reader for r in results} == {"cassandra", "cassandra-simple"}
    assert all(r.ok and r.images == stored["train"] for r in results), [r.problems for r in results]
    out = stored["root"] / "plugin.npz"
    assert cli(["split", *tables, *port, "--dataset", "plugin", "-o", str(out), "--format", "crs4"]) == 0
    from imgest.splits.split import load_split

    split = load_split(out)
    assert sum(len(p) for p in split.parts) == stored["train"]
    assert split.num_classes == len(names)
    # the plugin numbers classes in the order os.scandir lists them; imgest keeps its labels and records the names
    assert sorted(names.values()) == list(range(len(names)))
    assert {uuid.UUID(i.decode()) for i in rs.ids} == {uuid.UUID(str(i)) for i in split.row_ids}
