"""The docs site builds with `mkdocs build --strict` (how CI builds it), its generated references are complete, and
its diagrams are Mermaid (docs/hooks.py fails the strict build on a malformed one or on ASCII art)."""

from __future__ import annotations

import argparse
import html
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from types import ModuleType

import pytest

from imgest.cli import build_parser
from imgest.flow.request import IngestRequest

ROOT = Path(__file__).resolve().parents[2]
# Plots of docs/bench/ that no page shows, and why (each is named in the text beside its JSON instead).
# Pages that draw a DAG or the data flow, and how many diagrams each has at least.
DIAGRAMS = {
    "README.md": 1,
    "ARCHITECTURE.md": 1,
    "docs/index.md": 1,
    "docs/trigger-form.md": 1,
    "docs/refresh.md": 2,
    "docs/services.md": 1,
}
NOT_SHOWN = {"issue18-profile.png": "a scratch profile of transform routes (not `imgest bench`), unreadable labels"}


def _command_paths(parser: argparse.ArgumentParser, prefix: str = "imgest") -> Iterator[str]:
    """Every command and subcommand of PARSER, as typed ("imgest ingest cassandra")."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prefix} {name}"
                yield from _command_paths(sub, f"{prefix} {name}")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The site built strictly into a temporary folder, and the build's log."""
    out = tmp_path_factory.mktemp("docs") / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's end-of-life banner, printed on every build
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, f"mkdocs build --strict failed (make docs to reproduce):\n{log}"
    return out, log


def test_build_is_strict_and_clean(site: tuple[Path, str]) -> None:
    out, log = site
    warnings = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]
    assert warnings == [], "\n".join(warnings)
    pages = {p.relative_to(out).as_posix() for p in out.rglob("*.html")}
    expected = {p.relative_to(ROOT / "docs").with_suffix(".html").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert expected | {"reference/cli.html", "reference/params.html"} <= pages


def test_cli_reference_names_every_command(site: tuple[Path, str]) -> None:
    page = (site[0] / "reference" / "cli.html").read_text()
    commands = list(_command_paths(build_parser()))
    assert len(commands) > 20
    missing = [c for c in commands if f"<code>{c}</code>" not in page]
    assert missing == [], f"commands absent from the generated CLI reference: {missing}"


def test_params_reference_names_every_field(site: tuple[Path, str]) -> None:
    page = (site[0] / "reference" / "params.html").read_text()
    missing = [
        f.name
        for f in fields(IngestRequest)
        if f"<code>{f.name}</code>" not in page or html.escape(f.metadata["param"]["title"], quote=False) not in page
    ]
    assert missing == [], f"IngestRequest fields absent from the generated Params reference: {missing}"


def test_every_bench_plot_is_shown(site: tuple[Path, str]) -> None:
    shown = "".join(p.read_text() for p in site[0].rglob("*.html"))
    plots = sorted(p.name for p in (ROOT / "docs" / "bench").glob("*.png"))
    assert plots
    unshown = [name for name in plots if f'src="bench/{name}"' not in shown and name not in NOT_SHOWN]
    assert unshown == [], f"plots in docs/bench/ shown on no page: {unshown}"


def _hooks() -> ModuleType:
    """docs/hooks.py, loaded as mkdocs loads it (docs/ is no package)."""
    spec = importlib.util.spec_from_file_location("imgest_docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pages() -> list[Path]:
    return sorted((ROOT / "docs").rglob("*.md")) + [
        ROOT / name for name in ("README.md", "ARCHITECTURE.md", "CAPACITY.md")
    ]


def test_diagrams_are_mermaid_and_parse(site: tuple[Path, str]) -> None:
    hooks = _hooks()
    problems = {
        page.relative_to(ROOT).as_posix(): found
        for page in _pages()
        if (found := hooks.diagram_problems(page.read_text(), ROOT))
    }
    assert problems == {}
    for name, least in DIAGRAMS.items():
        blocks = [b for b in hooks.code_blocks((ROOT / name).read_text()) if b[1] == "mermaid"]
        assert len(blocks) >= least, f"{name}: {len(blocks)} mermaid diagrams, expected at least {least}"
    for page in ("index.html", "trigger-form.html", "refresh.html", "services.html", "architecture.html"):
        assert '<pre class="mermaid"><code>flowchart' in (site[0] / page).read_text(), f"{page}: no rendered diagram"


BAD_DIAGRAMS = {
    "ascii-dag": "```\nvalidate -> scan -+-> ingest -+\n                  +-> other  -+-> split\n```\n",
    "ascii-columns": "```text\nscan\n  |\n  v\ningest\n```\n",
    "box-drawing": "```{ .text .dag }\n source\n    \u2502\n    \u25bc\n manifest\n```\n",
    "unknown-type": "```mermaid\nflowchat TD\n    a --> b\n```\n",
    "bad-direction": "```mermaid\nflowchart XY\n    a --> b\n```\n",
    "unbalanced": '```mermaid\nflowchart TD\n    a["x"] --> b(["y"]\n```\n',
    "bare-arrow": "```mermaid\nflowchart LR\n    a -> b\n```\n",
    "open-subgraph": "```mermaid\nflowchart LR\n    subgraph g\n    a --> b\n```\n",
    "empty": "```mermaid\n%% nothing\n```\n",
}


@pytest.mark.parametrize("name", sorted(BAD_DIAGRAMS))
def test_diagram_check_fails_on_a_bad_sample(name: str) -> None:
    assert _hooks().diagram_problems(BAD_DIAGRAMS[name]) != []


def test_diagram_check_passes_code_and_good_mermaid() -> None:
    good = (
        "```python\ndef f(a: int) -> int:\n    return a | 1  # x -> y\n```\n"
        '```mermaid\nflowchart TD\n    a["f(x) [y]"] -->|"g(z"| b{c} -.-> d(["e"])\n    a & b --> d\n'
        "    subgraph s [title]\n        e --> f\n    end\n```\n"
    )
    assert _hooks().diagram_problems(good) == []


def test_strict_build_fails_on_an_ascii_diagram(tmp_path: Path) -> None:
    """The check runs in the build itself: a page with the old ASCII DAG fails `mkdocs build --strict`."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# x\n\n" + BAD_DIAGRAMS["ascii-dag"])
    (tmp_path / "mkdocs.yml").write_text(
        f"site_name: x\ndocs_dir: docs\nhooks:\n  - {ROOT / 'docs' / 'hooks.py'}\n"
        "markdown_extensions:\n  - pymdownx.superfences\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(tmp_path / "mkdocs.yml"),
            "-d",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "ASCII-art diagram" in done.stdout + done.stderr
