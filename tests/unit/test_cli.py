"""Every command has --help, and bad input gets a one-line error."""

from __future__ import annotations

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
