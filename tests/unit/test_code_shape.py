"""The shape of the code (issues #43, #54): packages in layers, one direction between them, no import circle among
the modules imgest ships (imgest/, and dags/, operators/, jobs/ as the imgest.dags, imgest.operators, imgest.jobs
they install as; imports inside functions count), no module over 400 lines, no function over 60.

Exempt from the sizes: the CLI's ``register`` functions in imgest/cli/, which only build argparse subparsers (a
table of options reads best whole), and the entries of ALLOWED, each with its reason. The layers are written down in
ARCHITECTURE.md ("Layers"); each check is a function of a tree, and test_the_checks_fail_on_planted_faults runs
the same functions over a tree with every fault planted.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Folder -> the name its modules ship under (setup.py's MAPPED).
PACKAGES = {"imgest": "imgest", "dags": "imgest.dags", "operators": "imgest.operators", "jobs": "imgest.jobs"}
# The runtime's packages, bottom to top: a package imports only packages in layers below its own, or beside it in
# its own layer (one way). The tools beside the runtime (BESIDE) may import any runtime package and each other; of
# the runtime, only the CLI imports them.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("core",),
    ("sources",),
    ("transform",),
    ("sinks",),
    ("spark", "splits"),
    ("readback", "validate"),
    ("flow", "jobs"),
    ("operators", "dags"),
    ("cli",),
)
BESIDE = ("bench", "services", "peers")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
# "path:function" -> why it may be longer than MAX_FUNCTION_LINES (keep this short).
ALLOWED: dict[str, str] = {}


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name as shipped -> file, for every .py file under PACKAGES (a package under its own name)."""
    mods = {}
    for folder, shipped in PACKAGES.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            mods[".".join((shipped, *parts))] = path
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


def package_of(module: str) -> str:
    """The first-level package of an imgest module (``imgest.sinks.files.write`` -> ``sinks``; the root -> "")."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def package_graph(graph: dict[str, set[str]]) -> dict[str, dict[str, list[str]]]:
    """Package -> package it imports -> the module imports behind that edge ("a -> b"), from a module GRAPH."""
    edges: dict[str, dict[str, list[str]]] = {}
    for module, targets in graph.items():
        for target in targets:
            a, b = package_of(module), package_of(target)
            if a and b and a != b:
                edges.setdefault(a, {}).setdefault(b, []).append(f"{module} -> {target}")
    return edges


def _rank(package: str) -> int | None:
    return next((i for i, layer in enumerate(LAYERS) if package in layer), None)


def layer_faults(edges: dict[str, dict[str, list[str]]]) -> list[str]:
    """Each package import that goes against LAYERS: upward, from the runtime into a tool beside it (the CLI
    aside), from a tool into the CLI, or from or to a package LAYERS does not place."""
    faults = []
    for a, targets in sorted(edges.items()):
        for b, why in sorted(targets.items()):
            ra, rb = _rank(a), _rank(b)
            if (ra is None and a not in BESIDE) or (rb is None and b not in BESIDE):
                fault = "not placed in LAYERS or BESIDE"
            elif ra is not None and rb is not None:
                fault = "upward" if rb > ra else ""
            elif ra is not None:  # runtime -> a tool
                fault = "" if a == "cli" else "the runtime imports a tool beside it"
            else:  # a tool -> the runtime or another tool
                fault = "a tool imports the CLI" if b == "cli" else ""
            if fault:
                faults.append(f"{a} -> {b} ({fault}): {why[0]}" + (f" and {len(why) - 1} more" if len(why) > 1 else ""))
    return faults


def circle_faults(root: Path = ROOT) -> list[str]:
    """The import circles among the modules of ROOT, and among its packages (a two-way import is a circle of two)."""
    graph = import_graph(module_files(root))
    edges = package_graph(graph)
    found = [" <-> ".join(c) for c in cycles(graph)]
    found += ["packages " + " <-> ".join(c) for c in cycles({a: set(b) for a, b in edges.items()})]
    return found


def size_faults(root: Path = ROOT) -> list[str]:
    """Each module over MAX_MODULE_LINES and each function over MAX_FUNCTION_LINES (exemptions aside) under ROOT."""
    faults = []
    for path in module_files(root).values():
        rel = path.relative_to(root).as_posix()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES:
            faults.append(f"{rel}: {n} lines")
        faults += [f"{rel}:{name} {n} lines" for name, n in long_functions(path) if not _exempt(rel, name)]
    return faults


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(name, lines) of each function or method in PATH longer than LIMIT lines, decorators aside."""
    tree = ast.parse(path.read_text())
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > limit
    ]


def _exempt(rel: str, function: str) -> bool:
    return (rel.startswith("imgest/cli/") and function == "register") or f"{rel}:{function}" in ALLOWED


def layer_faults_of(root: Path = ROOT) -> list[str]:
    """layer_faults of the tree at ROOT."""
    return layer_faults(package_graph(import_graph(module_files(root))))


def test_no_import_circle() -> None:
    found = circle_faults()
    assert not found, "import circles (move the shared pieces down):\n" + "\n".join(found)


def test_packages_keep_their_layers() -> None:
    found = layer_faults_of()
    assert not found, "imports against the layers (ARCHITECTURE.md, Layers):\n" + "\n".join(found)


def test_no_module_or_function_over_its_size() -> None:
    found = size_faults()
    assert not found, (
        f"over {MAX_MODULE_LINES} lines a module or {MAX_FUNCTION_LINES} a function (split along the seams):\n"
        + "\n".join(found)
    )


def test_every_allowance_still_names_a_long_function() -> None:
    for entry, reason in ALLOWED.items():
        rel, _, function = entry.partition(":")
        assert reason.strip(), f"{entry}: say why it may be long"
        assert function in dict(long_functions(ROOT / rel)), f"{entry} is no longer over the limit: drop it"


def unplaced_packages(root: Path = ROOT) -> list[str]:
    """The first-level packages of imgest under ROOT (and the shipped dags/operators/jobs) that LAYERS and BESIDE
    do not place."""
    placed = {p for layer in LAYERS for p in layer} | set(BESIDE)
    return sorted({package_of(m) for m in module_files(root)} - {""} - placed)


def test_every_package_is_placed() -> None:
    """Each first-level package of imgest (and the shipped dags/operators/jobs) has its place in LAYERS or BESIDE."""
    found = unplaced_packages()
    assert not found, f"place these in LAYERS or BESIDE: {found}"


def _plant(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checks_fail_on_planted_faults(tmp_path: Path) -> None:
    """The checks the tests above run, over a tree with each fault planted: a circle through a lazy import, a circle
    through operators/ and jobs/ as the code imports them (imgest.operators.*), a two-way package import, an upward
    import, the runtime importing a tool, a tool importing the CLI, a package no layer places (importing and
    imported), a long module and a long function: every kind of fault each check reports."""
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    _plant(
        tmp_path,
        {
            "imgest/__init__.py": "",
            "imgest/core/__init__.py": "",
            "imgest/core/a.py": "from imgest.core.b import g\n\n\ndef f():\n    return g()\n",
            "imgest/core/b.py": f"def g():\n    from imgest.core import a\n\n{body}    return a\n",
            "imgest/sources/__init__.py": "",
            "imgest/sources/scan.py": "from imgest.sinks.write import put\n",
            "imgest/sinks/__init__.py": "",
            "imgest/sinks/write.py": "import imgest.sources.scan\n\nput = 1\n",
            "imgest/readback/step.py": "from imgest.bench.report import table\n",
            "imgest/bench/report.py": "from imgest.core.a import f\n\ntable = f\n",
            "imgest/bench/run.py": "from imgest.cli.main import main\n",
            "imgest/cli/main.py": "main = 1\n",
            "imgest/mystery/x.py": "from imgest.core.a import f\n",
            "imgest/flow/y.py": "from imgest.mystery.x import f\n",
            "operators/__init__.py": "",
            "operators/ingest.py": "from . import hooks\n" + "\n" * MAX_MODULE_LINES,
            "operators/hooks.py": "from imgest.jobs.pack import run\n",
            "jobs/__init__.py": "",
            "jobs/pack.py": "def run():\n    from imgest.operators.ingest import hooks\n\n    return hooks\n",
        },
    )
    files = module_files(tmp_path)
    assert {"imgest.operators.ingest", "imgest.jobs.pack", "imgest.core.b"} <= set(files)
    graph = import_graph(files)
    assert graph["imgest.core.b"] == {"imgest.core.a"}  # `from imgest.core import a` names the submodule
    assert graph["imgest.jobs.pack"] == {"imgest.operators.ingest"}  # as the code imports them
    assert cycles({"x": {"y"}, "y": {"z"}, "z": set()}) == []
    assert sorted(circle_faults(tmp_path)) == [
        "imgest.core.a <-> imgest.core.b",
        "imgest.jobs.pack <-> imgest.operators.hooks <-> imgest.operators.ingest",
        "imgest.sinks.write <-> imgest.sources.scan",
        "packages jobs <-> operators",
        "packages sinks <-> sources",
    ]
    faults = layer_faults_of(tmp_path)
    assert [f.split(":")[0] for f in faults] == [
        "bench -> cli (a tool imports the CLI)",
        "flow -> mystery (not placed in LAYERS or BESIDE)",
        "jobs -> operators (upward)",
        "mystery -> core (not placed in LAYERS or BESIDE)",
        "readback -> bench (the runtime imports a tool beside it)",
        "sources -> sinks (upward)",
    ]
    assert unplaced_packages(tmp_path) == ["mystery"]
    assert sorted(size_faults(tmp_path)) == [
        f"imgest/core/b.py:g {MAX_FUNCTION_LINES + 4} lines",
        f"operators/ingest.py: {MAX_MODULE_LINES + 1} lines",
    ]
