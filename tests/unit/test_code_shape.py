"""The shape of the code (issue #43): no import circle among imgest/, dags/, operators/ and jobs/ (imports inside
functions count), no module over 400 lines, no function over 60.

Exempt: the CLI's ``register`` functions in imgest/cli/, which only build argparse subparsers (a table of options
reads best whole), and the entries of ALLOWED, each with its reason.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("imgest", "dags", "operators", "jobs")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
# "path:function" -> why it may be longer than MAX_FUNCTION_LINES (keep this short).
ALLOWED: dict[str, str] = {}


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under PACKAGES (a package under its own name)."""
    mods = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            mods[name] = path
    return mods


def _known(name: str, mods: Iterable[str]) -> str | None:
    """NAME or its nearest enclosing module among MODS (an imported attribute resolves to its module)."""
    known = set(mods)
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(name: str, tree: ast.AST, is_package: bool, mods: Iterable[str]) -> set[str]:
    """The modules among MODS that module NAME (parsed as TREE) imports, anywhere in it (lazy imports too)."""
    mods = set(mods)
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [_known(a.name, mods) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, *([base] if base else [])])
            targets = [_known(f"{base}.{a.name}", mods) or _known(base, mods) for a in node.names]
        else:
            continue
        found.update(t for t in targets if t and t != name)
    return found


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules it imports, for FILES (see module_files)."""
    return {
        name: imports_of(name, ast.parse(path.read_text()), path.name == "__init__.py", files)
        for name, path in files.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of GRAPH: its strongly connected components of more than one module (Tarjan's
    algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(name, lines) of each function or method in PATH longer than LIMIT lines, decorators aside."""
    tree = ast.parse(path.read_text())
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > limit
    ]


def _exempt(path: Path, function: str) -> bool:
    rel = path.relative_to(ROOT).as_posix()
    return (rel.startswith("imgest/cli/") and function == "register") or f"{rel}:{function}" in ALLOWED


def test_no_import_circle() -> None:
    found = cycles(import_graph(module_files()))
    assert not found, "import circles (move the shared pieces down):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_module_over_400_lines() -> None:
    over = {
        path.relative_to(ROOT).as_posix(): n
        for path in module_files().values()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split along their seams): {over}"


def test_no_function_over_60_lines() -> None:
    over = [
        f"{path.relative_to(ROOT).as_posix()}:{name} {n} lines"
        for path in module_files().values()
        for name, n in long_functions(path)
        if not _exempt(path, name)
    ]
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(over)


def test_every_allowance_still_names_a_long_function() -> None:
    for entry, reason in ALLOWED.items():
        rel, _, function = entry.partition(":")
        assert reason.strip(), f"{entry}: say why it may be long"
        assert function in dict(long_functions(ROOT / rel)), f"{entry} is no longer over the limit: drop it"


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """A synthetic tree with a circle through a lazy import, a long module and a long function is caught."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "imgest" / "__init__.py").write_text("")
    (tmp_path / "imgest" / "a.py").write_text("from imgest.b import g\n\n\ndef f():\n    return g()\n")
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "imgest" / "b.py").write_text(f"def g():\n    from imgest import a\n\n{body}    return a\n")
    (tmp_path / "jobs" / "c.py").write_text("from . import d\n" + "\n" * MAX_MODULE_LINES)
    (tmp_path / "jobs" / "d.py").write_text("import jobs.c\n")
    files = module_files(tmp_path)
    assert set(files) == {"imgest", "imgest.a", "imgest.b", "jobs.c", "jobs.d"}
    graph = import_graph(files)
    assert graph["imgest.b"] == {"imgest.a"}  # `from imgest import a` names the submodule
    assert cycles(graph) == [["imgest.a", "imgest.b"], ["jobs.c", "jobs.d"]]
    assert cycles({"x": {"y"}, "y": {"z"}, "z": set()}) == []
    assert [n for n, _ in long_functions(files["imgest.b"])] == ["g"]
    assert len(files["jobs.c"].read_text().splitlines()) > MAX_MODULE_LINES
