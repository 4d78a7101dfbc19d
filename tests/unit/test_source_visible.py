"""A local source the reading host cannot see fails the read (every image would be lost), while one file that
vanished after the scan is quarantined as MISSING and the rest are stored."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from imgest.core.quarantine import BadImage, Reason
from imgest.sources.manifest import Candidate
from imgest.sources.read import SourceNotVisibleError, read_ahead, read_candidate


def _cand(rel: str) -> Candidate:
    return Candidate("id-" + rel, "train", rel, "n01", 0, 4, 0.0)


def test_a_source_folder_missing_on_this_host_is_a_failure(tmp_path: Path) -> None:
    root = tmp_path / "imagenet"  # what the scan saw on another host; nothing here
    with pytest.raises(SourceNotVisibleError) as err:
        read_candidate(root, _cand("train/n01/a.JPEG"))
    assert str(root) in str(err.value)
    assert socket.gethostname() in str(err.value)
    assert "every Spark node mounts" in str(err.value)
    with pytest.raises(SourceNotVisibleError):  # the batch reader does not turn it into a quarantine either
        list(read_ahead(root, [_cand("train/n01/a.JPEG")]))


def test_one_file_gone_since_the_scan_is_quarantined(tmp_path: Path) -> None:
    (tmp_path / "train" / "n01").mkdir(parents=True)
    (tmp_path / "train" / "n01" / "b.JPEG").write_bytes(b"\xff\xd8\xff\xd9")
    got = dict((c.rel_path, r) for c, r in read_ahead(tmp_path, [_cand("train/n01/a.JPEG"), _cand("train/n01/b.JPEG")]))
    assert isinstance(got["train/n01/a.JPEG"], BadImage)
    assert got["train/n01/a.JPEG"].reason == Reason.MISSING
    assert got["train/n01/b.JPEG"] == b"\xff\xd8\xff\xd9"
