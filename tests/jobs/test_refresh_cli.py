"""`imgest refresh` from the command line, shards into a folder: versions, changes, no-change runs no Spark job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from imgest.sources.devdata.sample import SampleSpec, write_sample

pytestmark = [pytest.mark.slow]


def _refresh(datasets: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """`imgest refresh cli-ds` with no store named at all (shards into a folder need no Cassandra and no S3)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMGEST_CASSANDRA_", "IMGEST_S3_"))}
    env.update({"IMGEST_HOME": str(home), "IMGEST_DATASETS_FILE": str(datasets)})
    cmd = [str(Path(sys.executable).parent / "imgest"), "refresh", "cli-ds"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=600)


def test_cli_refresh_to_a_folder(tmp_path: Path) -> None:
    src, dest, home = tmp_path / "src", tmp_path / "shards", tmp_path / "home"
    write_sample(src, SampleSpec("imagefolder", classes=2, per_class=6, val_per_class=1, seed=8))
    datasets = tmp_path / "datasets.toml"
    datasets.write_text(
        f'[datasets.cli-ds]\nsource = "{src}"\nlayout = "imagefolder"\ntargets = ["shards"]\n'
        f'schedule = "@weekly"\ns3_dest = "{dest}"\nshard_max_count = 3\n'
    )
    first = _refresh(datasets, home)
    assert first.returncode == 0, first.stdout + first.stderr
    assert '"added": 14' in first.stdout
    original = json.loads((dest / "manifest.json").read_text())
    (src / "train" / "n01440764" / "n01440764_1.JPEG").unlink()
    second = _refresh(datasets, home)
    assert second.returncode == 0, second.stdout + second.stderr
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["version"]["changes"] == {"added": 0, "changed": 0, "removed": 1, "unchanged": 13}
    assert manifest["samples"] == {"train": 11, "val": 2}
    # Untouched shards stay where the first version wrote them (named, not copied); new ones go under a new key.
    before = {e["name"]: e["path"] for e in original["shards"]}
    kept = [e for e in manifest["shards"] if before.get(e["name"]) == e["path"]]
    assert kept
    assert all(e["path"].startswith(f"v/{original['key']}/") for e in kept)
    assert all(e["path"].startswith(f"v/{manifest['key']}/") for e in manifest["shards"] if e not in kept)
    assert manifest["previous"] == original["key"]
    # verified on Spark's executors, the kept shards by size (hashed when the first version wrote them)
    assert f"shards: {len(manifest['shards'])} checked on Spark ({len(kept)} kept ones by size)" in second.stdout
    logs = sorted(home.rglob("spark-refresh-shards.log"))
    stamp = logs[0].stat().st_mtime
    third = _refresh(datasets, home)
    assert third.returncode == 0, third.stdout + third.stderr
    assert "no change since version" in third.stdout
    assert logs[0].stat().st_mtime == stamp  # no Spark job ran
    assert json.loads((dest / "manifest.json").read_text()) == manifest
    # Another transform (here the quality; an upgrade that changes the JPEG decoder is the same case): no stored
    # image can be kept, so every one is re-transformed, even though no source file changed.
    datasets.write_text(datasets.read_text() + "quality = 80\n")
    fourth = _refresh(datasets, home)
    assert fourth.returncode == 0, fourth.stdout + fourth.stderr
    redone = json.loads((dest / "manifest.json").read_text())
    assert redone["version"]["changes"] == {"added": 0, "changed": 13, "removed": 0, "unchanged": 0}
    assert redone["transform"]["quality"] == 80
    assert redone["samples"] == manifest["samples"]
    assert {e["path"].split("/")[1] for e in redone["shards"]} == {redone["key"]}
    assert all((dest / e["path"]).is_file() for e in manifest["shards"])  # the previous version is still readable
