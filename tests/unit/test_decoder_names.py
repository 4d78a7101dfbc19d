"""The JPEG decoder by behaviour (issue #52): auto, fast, fast-bilinear and pillow in the CLI and the trigger form;
the revision names still accepted; a version records the revision a name stands for."""

from __future__ import annotations

import pytest

from imgest.cli import build_parser
from imgest.core.errors import ConfigError
from imgest.flow.request import IngestRequest
from imgest.flow.request_form import param_specs
from imgest.transform import fastjpeg
from imgest.transform.image import TransformSpec
from imgest.transform.revisions import DECODER_CHOICES, resolve_decoder


def test_each_name_stands_for_one_revision() -> None:
    assert resolve_decoder("auto") == fastjpeg.default_decoder()
    assert fastjpeg.default_decoder() == "region4"  # this machine has the compiled module (make install-dev)
    assert [resolve_decoder(n) for n in ("fast", "fast-bilinear", "pillow")] == ["region4", "region3", "pillow"]
    assert [resolve_decoder(n) for n in ("region4", "region3", "region2", "region")] == [
        "region4",
        "region3",
        "region2",
        "region",
    ]


def test_an_unknown_name_lists_the_choices() -> None:
    with pytest.raises(ConfigError, match="'bicubic' is not one of auto, fast, fast-bilinear, pillow, region4"):
        TransformSpec("jpeg", 256, 224, 90, jpeg_decoder="bicubic")


def test_the_spec_records_the_revision_so_a_name_changes_no_version_key() -> None:
    fast = TransformSpec("jpeg", 256, 224, 90, jpeg_decoder="fast")
    assert fast.jpeg_decoder == "region4"
    assert fast == TransformSpec("jpeg", 256, 224, 90, jpeg_decoder="region4") == TransformSpec("jpeg", 256, 224, 90)
    assert fast.as_dict()["jpeg_decoder"] == "region4"
    request = IngestRequest(jpeg_decoder="fast-bilinear")
    assert request.transform().jpeg_decoder == "region3"


def test_help_and_form_name_the_behaviours() -> None:
    parser = build_parser()
    ingest = parser._subparsers._group_actions[0].choices["ingest"]
    text = ingest._subparsers._group_actions[0].choices["shards"].format_help()
    assert "--jpeg-decoder {auto,fast,fast-bilinear,pillow}" in text
    for name in DECODER_CHOICES:
        assert f"{name}:" in " ".join(text.split())
    args = parser.parse_args(["ingest", "shards", "src", "--dest", "s3://b/p", "--jpeg-decoder", "region3"])
    assert args.jpeg_decoder == "region3"  # the old name still parses
    form = param_specs()["jpeg_decoder"]
    assert form["enum"][:4] == ["auto", "fast", "fast-bilinear", "pillow"]
    assert set(form["values_display"]) == set(form["enum"])
