"""MkDocs hook: the CLI and Params reference pages, generated at build time from the code they describe.

``reference/cli.md`` is written from ``imgest.cli.build_parser()`` (every command and subcommand, its usage and
its arguments) and ``reference/params.md`` from the fields of ``imgest.flow.request.IngestRequest`` (the trigger
form's Params: title, section, description, default, accepted values). Neither file is committed: they exist only
in the build, so they cannot drift from the parsers and the request. Registered in ``mkdocs.yml`` (``hooks:``).

It also checks every page's diagrams (``diagram_problems``): each ```` ```mermaid ```` block must open with a known
diagram type and keep its brackets balanced, and no other code block may hold an ASCII-art flow (box-drawing
characters, ``+--`` corners, columns of ``|`` and ``v``). A problem is a warning, so ``mkdocs build --strict``
fails on it; pages included with ``--8<--`` (ARCHITECTURE.md, CAPACITY.md) are checked as included.
"""

from __future__ import annotations

import argparse
import html
import json
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

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


# Mermaid's diagram types (https://mermaid.js.org/intro/syntax-reference.html): a block's first word must be one.
MERMAID_TYPES = frozenset(
    {
        "flowchart",
        "graph",
        "sequenceDiagram",
        "classDiagram",
        "stateDiagram",
        "stateDiagram-v2",
        "erDiagram",
        "journey",
        "gantt",
        "pie",
        "quadrantChart",
        "requirementDiagram",
        "gitGraph",
        "C4Context",
        "C4Container",
        "C4Component",
        "C4Dynamic",
        "C4Deployment",
        "mindmap",
        "timeline",
        "zenuml",
        "sankey-beta",
        "xychart-beta",
        "block-beta",
        "packet-beta",
        "kanban",
        "architecture-beta",
        "radar-beta",
    }
)
FLOW_DIRECTIONS = frozenset({"TB", "TD", "BT", "RL", "LR"})
_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})(.*)$")
_SNIPPET = re.compile(r'^[ \t]*--8<--[ \t]+"([^"]+)"[ \t]*$', re.M)
# An ASCII-art flow inside a code block: box-drawing or arrow glyphs, "+--" / "--+" / "-+-" corners and branches,
# or a line of nothing but column marks ("|", "v", "^") carrying an arrow down or up.
_ART_GLYPHS = re.compile(r"[\u2500-\u257f\u2190-\u21ff\u25b2-\u25c4\u27f5-\u27ff]")
_ART_CORNERS = re.compile(r"\+-{2,}|-{2,}\+|-\+-|-\+>")
_ART_COLUMNS = re.compile(r"^[ \t]*(?:[|v^][ \t]+)*[|v^][ \t]*$")
_OPEN, _CLOSE = "([{", ")]}"


def code_blocks(markdown: str) -> Iterator[tuple[int, str, list[str]]]:
    """(first line number, language, body lines) of each fenced code block of MARKDOWN."""
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        fence, info = opened.group(1), opened.group(2).strip()
        lang = info.strip("{} ").split(" ")[0].lstrip(".") if info else ""
        end = i + 1
        while end < len(lines) and not re.match(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", lines[end]):
            end += 1
        yield i + 1, lang, lines[i + 1 : end]
        i = end + 1


def mermaid_problems(body: list[str]) -> list[str]:
    """What is wrong with one mermaid block, superficially: its diagram type, its brackets, bare arrows, subgraphs."""
    text = [line for line in body if line.strip() and not line.strip().startswith("%%")]
    if not text:
        return ["empty mermaid block"]
    head = text[0].split()
    if head[0] not in MERMAID_TYPES:
        return [f"mermaid block opens with {head[0]!r}, not a diagram type such as flowchart, graph, sequenceDiagram"]
    problems = []
    flow = head[0] in ("flowchart", "graph")
    if flow and len(head) > 1 and head[1] not in FLOW_DIRECTIONS:
        problems.append(f"{head[0]} direction {head[1]!r} is none of {sorted(FLOW_DIRECTIONS)}")
    if flow and len(text) == 1:
        problems.append(f"{head[0]} without nodes")
    stack: list[tuple[str, int]] = []
    for n, line in enumerate(text[1:], 2):
        bare = re.sub(r'"[^"]*"', '""', line)  # quoted labels may hold any bracket
        bare = re.sub(r"\|[^|]*\|", "||", bare)  # so may edge labels (-->|text|)
        if flow and re.search(r"(?<![-.=<])->", bare):
            problems.append(f"line {n}: '->' is no flowchart edge (use '-->'): {line.strip()}")
        for ch in bare:
            if ch in _OPEN:
                stack.append((ch, n))
            elif ch in _CLOSE:
                if not stack or _OPEN.index(stack[-1][0]) != _CLOSE.index(ch):
                    problems.append(f"line {n}: unbalanced {ch!r}: {line.strip()}")
                    stack = []
                    break
                stack.pop()
    problems += [f"line {n}: {ch!r} never closed" for ch, n in stack]
    if flow:
        opened = sum(1 for line in text if line.split()[0] == "subgraph")
        closed = sum(1 for line in text if line.strip() == "end")
        if opened != closed:
            problems.append(f"{opened} subgraph(s) but {closed} 'end'")
    return problems


def art_problems(body: list[str]) -> list[str]:
    """Lines of a (non-mermaid) code block that draw an ASCII-art flow."""
    for n, line in enumerate(body, 1):
        if _ART_GLYPHS.search(line) or _ART_CORNERS.search(line) or (_ART_COLUMNS.match(line) and line.strip()):
            return [f"line {n} draws an ASCII-art diagram (make it a ```mermaid block): {line.strip()}"]
    return []


def diagram_problems(markdown: str, base: Path | None = None) -> list[str]:
    """Every malformed mermaid block and ASCII-art diagram of MARKDOWN, after including its --8<-- snippets
    (resolved from BASE, pymdownx.snippets' base_path)."""
    if base is not None:
        markdown = _SNIPPET.sub(lambda m: (base / m.group(1)).read_text(encoding="utf-8"), markdown)
    problems = []
    for start, lang, body in code_blocks(markdown):
        found = mermaid_problems(body) if lang == "mermaid" else art_problems(body)
        problems += [f"code block at line {start}: {p}" for p in found]
    return problems


def on_page_markdown(markdown: str, *, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Warn (so --strict fails) about each malformed mermaid block or ASCII-art diagram on PAGE."""
    base = Path(config.config_file_path).resolve().parent
    for problem in diagram_problems(markdown, base):
        log.warning("%s: %s", page.file.src_path, problem)
    return markdown
