"""Smoke test of `imgest bench pack`'s peer code paths (no timing asserted): equal members, seeded order."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from PIL import Image

from imgest.bench.pack import run_litdata, run_shardwriter
from imgest.bench.pack_peers import peer_items
from imgest.sources.devdata.sample import SampleSpec, write_sample
from imgest.sources.scan import scan_to_dir


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("peers")
    write_sample(root / "src", SampleSpec("imagefolder", classes=2, per_class=5, val_per_class=0, seed=2))
    scan_to_dir(root / "src", root / "m")
    return root / "m"


def test_peer_order_is_seeded_and_complete(manifest: Path) -> None:
    items = peer_items(manifest)
    assert items == peer_items(manifest)
    assert sorted(items) != items or len(items) < 3  # shuffled
    assert len({key for _, _, key in items}) == len(items) == 10


@pytest.mark.parametrize("transform", ["natural", "imgest"])
def test_shardwriter_pool_writes_every_sample_with_all_members(manifest: Path, tmp_path: Path, transform: str) -> None:
    result = run_shardwriter(manifest, tmp_path, max_count=3, transform=transform, workers=2)
    members: dict[str, set[str]] = {}
    for tar in sorted((tmp_path / "wds").glob("*.tar")):
        with tarfile.open(tar) as tf:
            for m in tf.getmembers():
                key, ext = m.name.split(".", 1)
                members.setdefault(key, set()).add(ext)
                data = tf.extractfile(m).read()  # type: ignore[union-attr]
                if ext == "jpg":
                    assert Image.open(io.BytesIO(data)).size == (224, 224)
                if ext == "json":
                    assert set(json.loads(data)) == {"label", "source", "sha256"}
    assert {k for _, _, k in peer_items(manifest)} == set(members)
    assert all(exts == {"jpg", "cls", "json"} for exts in members.values())
    assert result["bytes"] == sum(p.stat().st_size for p in (tmp_path / "wds").iterdir())


@pytest.mark.peers
def test_litdata_peer_writes_every_sample(manifest: Path, tmp_path: Path) -> None:
    result = run_litdata(manifest, tmp_path, "imgest", workers=1)
    assert result is not None, "LitData is not installed (requirements/bench.txt)"
    out = tmp_path / "litdata"
    chunks = json.loads((out / "index.json").read_text())["chunks"]
    assert sum(c["chunk_size"] for c in chunks) == len(peer_items(manifest)) == 10  # samples in the chunks
    assert sorted(c["filename"] for c in chunks) == sorted(p.name for p in out.glob("*.bin"))
    assert result["bytes"] == sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
