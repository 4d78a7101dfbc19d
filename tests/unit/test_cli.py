"""Every command has --help, and bad input gets a one-line error."""

from __future__ import annotations

from pathlib import Path

import pytest

from imgest.cli import build_parser, main


def _commands(parser, prefix=()):  # walk sub-parsers
    import argparse

    yield prefix
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*prefix, name))


@pytest.mark.parametrize("argv", list(_commands(build_parser())), ids=lambda a: " ".join(a) or "imgest")
def test_every_command_has_help(argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: imgest")
    assert len(out.splitlines()) > 3


def test_unknown_service_is_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["services", "status", "nosuch"]) == 1
    assert "unknown service 'nosuch'" in capsys.readouterr().err


def test_ingest_options_reach_the_job_argv() -> None:
    from imgest.spark.job_options import CASSANDRA_OPTIONS, TRANSFORM_OPTIONS, forward

    args = build_parser().parse_args(
        ["ingest", "cassandra", "/data/x", "--keyspace", "inet", "--crop", "192", "--table-suffix", "_o"]
    )
    argv = forward(args, CASSANDRA_OPTIONS) + forward(args, TRANSFORM_OPTIONS)
    pairs = dict(zip(argv[::2], argv[1::2], strict=True))
    assert pairs["--keyspace"] == "inet"
    assert pairs["--crop"] == "192"
    assert pairs["--table-suffix"] == "_o"
    assert pairs["--resize"] == "256"  # the one default, from imgest.core.defaults


def test_scan_of_missing_folder_names_it(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope"
    assert main(["scan", str(missing), "--out", str(tmp_path / "m")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("imgest: error:")
    assert str(missing) in err


def test_split_from_cache_writes_parts(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    import uuid

    import numpy as np

    from imgest.splits import load_split
    from imgest.splits.sources import LabelledRows

    ids = [uuid.uuid5(uuid.NAMESPACE_URL, str(i)) for i in range(20)]
    rows = LabelledRows(np.array([str(i) for i in ids]), np.array([i % 2 for i in range(20)]), 2, {"kind": "test"})
    rows.save(tmp_path / "rows.parquet")
    out = tmp_path / "split.npz"
    assert main(["split", "--metadata-ifn", str(tmp_path / "rows.parquet"), "-r", "3,1", "-o", str(out)]) == 0
    split = load_split(out)
    assert [len(p) for p in split.parts] == [16, 4]  # each class of 10 cut 3:1 -> 7.5/2.5 -> 8/2
    assert "part 0: 0:8 1:8" in capsys.readouterr().out


def test_ingest_refuses_bad_names_and_destinations_before_any_work(tmp_path: Path) -> None:
    """Reserved, mixed-case and '..' inputs end with one line before the scan or spark-submit (no services)."""
    import subprocess
    import sys

    cases = [
        (["cassandra", str(tmp_path / "none"), "--keyspace", "select"], "keyspace 'select' is a reserved CQL word"),
        (["cassandra", str(tmp_path / "none"), "--keyspace", "Adva"], "keyspace 'Adva' holds upper-case letters"),
        (["shards", str(tmp_path / "none"), "--dest", "s3://imgest/../../etc"], "may not hold empty, '.' or '..'"),
    ]
    for argv, expected in cases:
        done = subprocess.run(
            [str(Path(sys.executable).parent / "imgest"), "ingest", *argv], capture_output=True, text=True, check=False
        )
        assert done.returncode == 1
        assert done.stderr.splitlines()[0].startswith("imgest: error: ")
        assert expected in done.stderr.splitlines()[0]
        assert "Traceback" not in done.stderr
        assert not (tmp_path / "none").exists()
