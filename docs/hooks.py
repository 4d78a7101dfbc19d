"""MkDocs hook: the CLI and Params reference pages, generated at build time from the code they describe.

``reference/cli.md`` is written from ``imgest.cli.build_parser()`` (every command and subcommand, its usage and
its arguments) and ``reference/params.md`` from the fields of ``imgest.flow.request.IngestRequest`` (the trigger
form's Params: title, section, description, default, accepted values). Neither file is committed: they exist only
in the build, so they cannot drift from the parsers and the request. Registered in ``mkdocs.yml`` (``hooks:``).
"""

from __future__ import annotations

import argparse
import html
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import MISSING, fields
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.imgest")

CLI_PAGE = "reference/cli.md"
PARAMS_PAGE = "reference/params.md"


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each direct subcommand of PARSER, in registration order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _text(text: str) -> str:
    """Plain TEXT (help, descriptions) made literal in Markdown: no HTML tags, no emphasis."""
    return html.escape(text, quote=False).replace("*", "\\*")


def _cell(text: str) -> str:
    """TEXT made safe for one Markdown table cell."""
    return _text(" ".join(text.split())).replace("|", "\\|")


def _argument_rows(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction | argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        names = ", ".join(action.option_strings) or (action.metavar or action.dest)
        value = "" if action.nargs == 0 else formatter._format_args(action, action.dest.upper())
        default = action.default
        shown = "" if default in (None, False, argparse.SUPPRESS) or action.nargs == 0 else f"`{default}`"
        required = " (required)" if action.required and action.option_strings else ""
        helptext = formatter._expand_help(action) if action.help else ""
        flag = f"`{names} {value}`" if value and action.option_strings else f"`{names}`"
        rows.append(f"| {flag}{required} | {_cell(helptext)} | {shown} |")
    return rows


def _command_section(path: str, summary: str, parser: argparse.ArgumentParser, level: int) -> list[str]:
    lines = [f"{'#' * level} `{path}`", ""]
    if summary:
        lines += [_text(summary[0].upper() + summary[1:] + ("" if summary.endswith(".") else ".")), ""]
    if parser.description and parser.description != summary:
        lines += [_text(parser.description), ""]
    lines += ["```text", parser.format_usage().strip(), "```", ""]
    rows = _argument_rows(parser)
    if rows:
        lines += ["| argument | what it does | default |", "| --- | --- | --- |", *rows, ""]
    for name, helptext, sub in _subcommands(parser):
        lines += _command_section(f"{path} {name}", helptext, sub, min(level + 1, 4))
    return lines


def cli_markdown() -> str:
    """The CLI reference page, from the parser the `imgest` console script uses."""
    from imgest.cli import build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps usage lines to the terminal width: fix it for the build
    parser = build_parser()
    index = [
        f"- [`imgest {name}`](#imgest-{name.replace(' ', '-')}): {_text(helptext)}"
        for name, helptext, _ in _subcommands(parser)
    ]
    lines = [
        "# Command line reference",
        "",
        "Generated at build time from `imgest.cli.build_parser()` (docs/hooks.py), so it always matches the",
        "installed `imgest`; `imgest COMMAND --help` prints the same. The pages of this site say when to use each.",
        "",
        *index,
        "",
        "```text",
        parser.format_usage().strip(),
        "```",
        "",
    ]
    for name, helptext, sub in _subcommands(parser):
        lines += _command_section(f"imgest {name}", helptext, sub, 2)
    return "\n".join(lines) + "\n"


def _accepts(meta: dict[str, Any], default: Any) -> str:
    if "enum" in meta:
        shown = meta.get("values_display", {})
        choices = [
            f"`{'null' if v is None else v}`" + (f": {_text(shown[v])}" if v in shown else "") for v in meta["enum"]
        ]
        return "one of " + "; ".join(choices)
    bounds = [
        f"at least {meta['minimum']}" if "minimum" in meta else "",
        f"at most {meta['maximum']}" if "maximum" in meta else "",
    ]
    parts = [" and ".join(b for b in bounds if b)]
    if "pattern" in meta:
        parts.append(f"matching `{meta['pattern']}`")
    types = meta.get("type") or {bool: "boolean", int: "integer", str: "string"}[type(default)]
    kind = " or ".join(types) if isinstance(types, list) else types
    return ", ".join([kind, *(p for p in parts if p)])


def params_markdown() -> str:
    """The Params reference page, from the fields of IngestRequest (what the DAG's trigger form is built from)."""
    from imgest.flow.request import SECTIONS, IngestRequest

    by_section: dict[str, list[Any]] = {section: [] for section in SECTIONS}
    for f in fields(IngestRequest):
        by_section[f.metadata["param"]["section"]].append(f)
    defaults = {f.name: (None if f.default is MISSING else f.default) for f in fields(IngestRequest)}
    lines = [
        "# Params reference",
        "",
        "Every field of the `ingest_imagenet` trigger form, generated at build time from",
        "`imgest.flow.request.IngestRequest` (docs/hooks.py): the form, the request and the Spark jobs' options share",
        "this one definition, so this page cannot drift from them. The key is what `--conf` takes; sections are",
        "listed in the form's order. [The trigger form](../trigger-form.md) says how the form behaves and how a run",
        "is validated.",
        "",
        "Every default, as one `--conf` (the form opens with these values; a run also needs `source` or",
        '`"sample": true`):',
        "",
        "```json",
        json.dumps(defaults, indent=2),
        "```",
        "",
    ]
    for section, section_fields in by_section.items():
        if not section_fields:
            continue
        lines += [f"## {section}", ""]
        for f in section_fields:
            meta = f.metadata["param"]
            default = None if f.default is MISSING else f.default
            lines += [
                f"### {meta['title']} (`{f.name}`)",
                "",
                _text(meta.get("description") or ""),
                "",
                f"- key: `{f.name}`",
                f"- default: `{json.dumps(default)}`",
                f"- accepts: {_accepts(meta, default)}",
                "",
            ]
    return "\n".join(lines) + "\n"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the generated reference pages to the build (they are never written into docs/)."""
    for path, build in ((CLI_PAGE, cli_markdown), (PARAMS_PAGE, params_markdown)):
        files.append(File.generated(config, path, content=build()))
        log.debug("generated %s", path)
    return files
