"""S3 sources without a server: URLs, the key rules, the source's own connection and how it reaches executors."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from imgest.core.settings import S3Settings
from imgest.sources.s3objects import S3SourceError, settings_for, split_url
from imgest.sources.s3scan import unsafe_key
from imgest.sources.s3source import SourceRoot, is_s3, s3_url, shippable_root, source_env, source_settings_from_env

SOURCE = S3Settings(
    endpoint_url="http://source.invalid:9000", access_key="AKSRC", secret_key="s3cr3t-src", region="eu-1"
)


def test_urls_survive_being_made_a_path() -> None:
    as_path = Path("s3://bucket/some/prefix/")  # what argparse's type=Path and Path(cfg.root) make of it
    assert str(as_path) == "s3:/bucket/some/prefix"
    assert is_s3(as_path)
    assert not is_s3(Path("/data/s3/bucket"))
    assert s3_url(as_path) == "s3://bucket/some/prefix"
    assert split_url("s3://bucket/a/ILSVRC2012_img_train.tar") == ("bucket", "a/ILSVRC2012_img_train.tar")
    assert split_url("s3://bucket") == ("bucket", "")
    with pytest.raises(S3SourceError, match="names no bucket"):
        split_url("s3://")


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("n01/../../etc/passwd.JPEG", "traversal"),
        ("n01/./a.JPEG", "traversal"),
        ("/n01/a.JPEG", "absolute"),
        ("n01//a.JPEG", "empty segment"),
        ("n01\\..\\a.JPEG", "backslash"),
        ("n01/a\x00.JPEG", "control character"),
        ("n01/a\x1b[31m.JPEG", "control character"),
    ],
)
def test_hostile_keys_are_refused_with_a_reason(key: str, reason: str) -> None:
    assert reason in (unsafe_key(key) or "")


@pytest.mark.parametrize("key", ["n01/a.JPEG", "n01/...JPEG", "n01/name with spaces.jpg", "n01/ünïcødé.png"])
def test_ordinary_keys_are_taken(key: str) -> None:
    assert unsafe_key(key) is None


def test_the_source_connection_is_its_own_and_falls_back_per_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IMGEST_S3_ENDPOINT", "http://dest.invalid:8333")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKDEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "dest-secret")
    for name in list(source_env(SOURCE)):
        monkeypatch.delenv(name, raising=False)
    fallback = source_settings_from_env()
    assert (fallback.endpoint_url, fallback.access_key) == ("http://dest.invalid:8333", "AKDEST")
    for name, value in source_env(SOURCE).items():
        monkeypatch.setenv(name, value)
    own = source_settings_from_env()
    assert (own.endpoint_url, own.access_key, own.secret_key, own.region) == (
        "http://source.invalid:9000",
        "AKSRC",
        "s3cr3t-src",
        "eu-1",
    )


def test_a_shipped_root_reads_with_the_drivers_connection_in_a_bare_process(tmp_path: Path) -> None:
    root = SourceRoot("s3://bucket/ds", SOURCE)
    assert root == "s3://bucket/ds"
    assert "s3cr3t" not in str(root)
    assert "s3cr3t" not in repr(root)
    blob = tmp_path / "task.pickle"
    blob.write_bytes(pickle.dumps({"root": root}))
    code = (
        "import pickle, sys; from pathlib import Path\n"
        "from imgest.sources.s3objects import settings_for\n"
        "cfg = pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "s = settings_for(Path(cfg['root']))\n"  # how an executor's read_candidate sees it
        "print(s.endpoint_url, s.access_key, s.secret_key)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "IMGEST_HOME": str(tmp_path / "home")}
    out = subprocess.run(
        [sys.executable, "-c", code, str(blob)], env=env, capture_output=True, text=True, check=True, cwd=Path.cwd()
    )
    assert out.stdout.split() == ["http://source.invalid:9000", "AKSRC", "s3cr3t-src"]


def test_a_local_root_is_shipped_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    assert shippable_root("/data/imagenet") == "/data/imagenet"
    assert type(shippable_root("/data/imagenet")) is str
    for name, value in source_env(SOURCE).items():
        monkeypatch.setenv(name, value)
    shipped = shippable_root("s3://bucket/other")
    assert isinstance(shipped, SourceRoot)
    assert shipped.settings == settings_for("s3:/bucket/other")
    assert shipped.settings.endpoint_url == "http://source.invalid:9000"


def test_a_connection_registered_for_the_dataset_serves_its_layout_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """A task registers the run's source URL; the manifest's root is the layout's folder below it (CLS-LOC), and a
    bucket or prefix that merely starts the same way is not the same source."""
    from imgest.sources.s3source import forget_sources, register_source, settings_for

    monkeypatch.setenv("IMGEST_SOURCE_S3_ENDPOINT", "http://env.invalid:9000")
    forget_sources()
    try:
        register_source("s3://bucket/imagenet/", SOURCE)
        assert settings_for("s3://bucket/imagenet/ILSVRC/Data/CLS-LOC") is SOURCE
        assert settings_for("s3://bucket/imagenet") is SOURCE
        assert settings_for("s3://bucket/imagenet2/x").endpoint_url == "http://env.invalid:9000"
    finally:
        forget_sources()
