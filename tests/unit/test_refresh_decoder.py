"""A refresh never quietly swaps imgest's compiled JPEG decoder for Pillow (#67).

A dataset version written with the compiled region decoder records it in its name (t-<transform key>-r<N>). On an
installation without the compiled module (an sdist built without libjpeg headers) the default decoder ``auto`` means
Pillow, whose bytes differ: the refresh would re-transform every image. It refuses instead, naming the version, the
revision and the two ways on; an explicit ``pillow`` re-transforms on purpose, and a version written with Pillow
refreshes as before.
"""

from __future__ import annotations

import pytest

from imgest.core.errors import ConfigError
from imgest.flow import refresh
from imgest.flow.request import IngestRequest
from imgest.sinks.cassandra.ingest import key_of_fields, transform_key
from imgest.transform import fastjpeg

CONF = {"target": "shards", "dataset": "dec", "source": "/data/src", "s3_dest": "s3://imgest/dec"}


@pytest.fixture
def without_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastjpeg, "_module", None)  # what an sdist without libjpeg headers installs
    assert fastjpeg.default_decoder() == "pillow"


def _version_written_by(decoder: str, number: int = 3) -> str:
    fields = IngestRequest.from_conf({**CONF, "jpeg_decoder": "pillow"}).transform().as_dict()
    return f"t-{key_of_fields({**fields, 'jpeg_decoder': decoder})}-r{number}"


def test_auto_without_the_compiled_decoder_refuses_a_version_it_wrote(without_compiled: None) -> None:
    request = IngestRequest.from_conf(CONF)  # jpeg_decoder: auto
    previous = _version_written_by("region4")
    assert refresh.compiled_decoder_of(previous, request) == "region4"
    with pytest.raises(ConfigError) as err:
        refresh._refuse_silent_pillow(previous, request)
    text = str(err.value)
    assert f"version {previous} was written with imgest's compiled JPEG decoder (region4)" in text
    assert "libjpeg-dev" in text
    assert "set jpeg_decoder to 'pillow' to re-transform on purpose" in text


def test_pillow_on_purpose_and_pillow_versions_refresh_as_before(without_compiled: None) -> None:
    on_purpose = IngestRequest.from_conf({**CONF, "jpeg_decoder": "pillow"})
    refresh._refuse_silent_pillow(_version_written_by("region4"), on_purpose)  # re-transforms, as asked
    assert refresh._transform_changed(_version_written_by("region4"), on_purpose)
    auto = IngestRequest.from_conf(CONF)
    written_by_pillow = f"t-{transform_key(auto.transform())}-r2"
    refresh._refuse_silent_pillow(written_by_pillow, auto)
    assert not refresh._transform_changed(written_by_pillow, auto)
    assert refresh.compiled_decoder_of(_version_written_by("region3"), auto) == "region3"


def test_with_the_compiled_decoder_auto_is_the_revision_and_nothing_is_refused() -> None:
    if not fastjpeg.available():
        pytest.skip("the compiled decoder is not built here")
    auto = IngestRequest.from_conf(CONF)
    assert refresh.compiled_decoder_of(_version_written_by("region4"), auto) is None
    assert not refresh._transform_changed(_version_written_by("region4"), auto)
