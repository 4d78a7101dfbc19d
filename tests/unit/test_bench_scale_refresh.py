"""`imgest bench scale --refresh` without services: the seeded mutation of a private hard-linked copy, and the
refresh summary's seconds per changed image and proportionality."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from imgest.bench import scale, scale_refresh
from imgest.sources.devdata.countscale import CountScaleSpec, write_count_scale


def _snapshot(root: Path) -> dict[str, tuple[int, str]]:
    return {
        str(p.relative_to(root)): (p.stat().st_ino, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_mutation_changes_a_private_copy_only(tmp_path: Path) -> None:
    source = write_count_scale(tmp_path / "src", CountScaleSpec(classes=4, train=2400, val=40), workers=1)
    before = _snapshot(source)
    copy = scale_refresh.private_copy(source, tmp_path / "copy")
    assert _snapshot(copy) == before  # hard links: the same inodes
    mutation = scale_refresh.mutate(copy, 2440)
    assert mutation.counts() == {"added": 1, "changed": 1, "removed": 1}  # 0.1 % of 2,440, a third of each
    big = scale_refresh.mutate(scale_refresh.private_copy(source, tmp_path / "big"), 2440, fraction=0.03)
    assert big.counts() == {"added": 24, "changed": 24, "removed": 24}
    assert len(set(big.changed) | set(big.removed)) == 48
    assert _snapshot(source) == before  # the cached tree was never written through a link
    after = _snapshot(tmp_path / "big")
    for rel in big.changed:
        assert after[rel][0] != before[rel][0]
        assert after[rel][1] != before[rel][1]
    assert not set(big.removed) & set(after)
    assert set(big.added) <= set(after)
    assert not set(big.added) & set(before)
    again = scale_refresh.mutate(scale_refresh.private_copy(source, tmp_path / "again"), 2440, fraction=0.03)
    assert again == big  # seeded: every run makes the same change


def _row(phase: str, sub: str, images: int, wall: float, changed: int = 0) -> dict:
    result = {"counts": {"added": changed, "changed": 0, "removed": 0}} if sub == "plan" else {}
    return {
        "target": "shards",
        "phase": phase,
        "step": f"{phase}.{sub}",
        "images": images,
        "wall_s": wall,
        "rss": {"task": 100 << 20},
        "rows_per_s": images / wall,
        "result": result,
    }


def _rows(finish_per_image: float) -> list[dict]:
    """Three sizes: a full first version at 1 ms an image, a 0.1 % change whose finish costs FINISH_PER_IMAGE
    seconds per image of the dataset (0: in proportion to the change)."""
    rows = []
    for n in (10_000, 100_000, 1_000_000):
        changed = n // 1000
        rows += [_row("refresh_first", "scan", n, n * 4e-5), _row("refresh_first", "plan", n, 1 + n * 1e-6, n)]
        rows += [_row("refresh_first", "ingest", n, 20 + n * 1e-3)]
        rows += [_row("refresh_nochange", "scan", n, n * 4e-5), _row("refresh_nochange", "plan", n, 1 + n * 1e-6)]
        rows += [_row("refresh_change", "scan", n, n * 4e-5), _row("refresh_change", "plan", n, 1 + n * 1e-6, changed)]
        rows += [_row("refresh_change", "ingest", n, 20 + changed * 1e-3)]
        rows += [_row("refresh_change", "finish", n, 1 + n * finish_per_image)]
    return rows


def test_refresh_summary_judges_proportionality() -> None:
    good = {(s["phase"]): s for s in scale_refresh.summarize_refresh(_rows(0.0))}
    change = good["refresh_change"]
    assert change["changed"] == [10, 100, 1000]
    assert change["s_per_changed_image"][-1] == pytest.approx((22 + 1_000_000 * 1e-6 + 1) / 1000, rel=1e-3)
    assert change["proportional"] is True
    assert good["refresh_nochange"]["s_per_changed_image"] == [None, None, None]
    assert good["refresh_nochange"]["proportional"] is True
    bad = {(s["phase"]): s for s in scale_refresh.summarize_refresh(_rows(2e-4))}  # re-stamps every row
    assert bad["refresh_change"]["proportional"] is False
    steps = [s["step"] for s in scale.summarize(_rows(0.0))]
    assert steps[:3] == ["refresh_first.scan", "refresh_first.plan", "refresh_first.ingest"]
    assert "time_ratio" in scale.summarize(_rows(0.0))[0]
