"""The import graph under src/ has no cycle: every import counts, those inside
functions too (a lazy import only hides a cycle until someone moves it)."""

import ast
from pathlib import Path

import pytest

import specsample

pytestmark = pytest.mark.pure

PACKAGE = Path(specsample.__file__).parent


def module_name(path: Path, root: Path) -> str:
    parts = ["specsample", *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """specsample module -> the specsample modules it imports, anywhere in its body."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    graph = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                # `from . import x` and `from .pkg import sub` name modules too.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in files and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_under_src():
    graph = import_graph()
    assert "specsample.cli" in graph and graph["specsample.cli"]  # the parser read the tree
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_lazy_cycle(tmp_path):
    """Negative control: the shape the review found (a command-line module importing
    the main one back, inside a function) is reported."""
    (tmp_path / "bench").mkdir()
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "bench" / "__init__.py").write_text("")
    (tmp_path / "cli.py").write_text("def parser():\n    from .bench.cli import add\n")
    (tmp_path / "bench" / "cli.py").write_text("def add():\n    from ..cli import UsageError\n")
    (tmp_path / "models.py").write_text("from . import cli\n")
    graph = import_graph(tmp_path)
    assert cycles(graph) == [["specsample.bench.cli", "specsample.cli"]]
    assert graph["specsample.models"] == {"specsample.cli"}
