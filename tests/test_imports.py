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


# The layers, lowest first: a module imports from its own folder or from a layer below
# (docs/architecture.md). The loop (decoding) takes a ready policy through the Policy
# protocol it defines (decoding/plans.py); the planner (policy) implements it and is made
# and timed above both (policy/make.py, called by app, serve and bench), so policy sits
# above decoding and decoding never imports it.
LAYERS = (("files", "processes", "machine"), ("backends",), ("output",), ("decoding",), ("policy",), ("app",),
          ("serve", "bench"), ("cli", "__main__", ""))
PEERS = ({"cli", "__main__", ""},)  # folders of one layer that import each other
LOOP = {"decoding", "policy"}  # the loop and the planner, which never know the editor's rules
# The editor's rules (a FIM prompt, llama.cpp's infill sampler) plug into the sampler
# from above; the loop and the policy never know them.
EDITOR_RULES = {"specsample.output.fim", "specsample.output.infill_sampler"}


def folder(module: str) -> str:
    """The top-level folder (or module) of specsample that holds a module; "" for the package."""
    return module.split(".")[1] if "." in module else ""


def layer(module: str) -> int:
    return next(i for i, names in enumerate(LAYERS) if folder(module) in names)


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The arrows that break the layering: up, sideways between folders, or from the
    loop or the policy to an editor rule."""
    wrong = []
    for source, targets in graph.items():
        for target in targets:
            a, b = folder(source), folder(target)
            sideways = layer(source) == layer(target) and a != b and not any({a, b} <= p for p in PEERS)
            editor = a in LOOP and target in EDITOR_RULES
            if layer(target) > layer(source) or sideways or editor:
                wrong.append((source, target))
    return sorted(wrong)


def test_imports_point_down_the_layers():
    graph = import_graph()
    assert {folder(m) for m in graph} <= {name for names in LAYERS for name in names}  # every folder has a layer
    assert upward_imports(graph) == []


def test_the_layering_check_finds_an_upward_import(tmp_path):
    """Negative control: the loop importing the server or the planner's factory (the
    pair issue 52 removed: stream() calibrating a policy), a backend importing the
    editor's FIM prompt, and the sampler importing the infill sampler are each reported;
    the planner importing the loop's plans is not."""
    for folder_name in ("decoding", "serve", "backends", "output", "policy"):
        (tmp_path / folder_name).mkdir()
        (tmp_path / folder_name / "__init__.py").write_text("")
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "output" / "fim.py").write_text("")
    (tmp_path / "output" / "infill_sampler.py").write_text("")
    (tmp_path / "serve" / "worker.py").write_text("from ..decoding import generate\n")
    (tmp_path / "decoding" / "generate.py").write_text("def f():\n    from ..serve import worker\n"
                                                       "from ..policy.make import as_policy\n")
    (tmp_path / "decoding" / "plans.py").write_text("")
    (tmp_path / "policy" / "make.py").write_text("from ..decoding.plans import FixedK\n")
    (tmp_path / "decoding" / "sampling.py").write_text("from ..output.infill_sampler import x\n")
    (tmp_path / "backends" / "base.py").write_text("from ..output.fim import FimFormat\n")
    assert upward_imports(import_graph(tmp_path)) == [
        ("specsample.backends.base", "specsample.output.fim"),
        ("specsample.decoding.generate", "specsample.policy.make"),
        ("specsample.decoding.generate", "specsample.serve.worker"),
        ("specsample.decoding.sampling", "specsample.output.infill_sampler"),
    ]


# The research harness (benchmarks/ at the repository root, not installed) imports
# specsample; nothing installed imports it back. Its one-question studies use the bench
# only through the names specsample.bench publishes, never its modules.
REPO = PACKAGE.parents[1]


def absolute_imports(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """(module, names imported from it) for every absolute import in a file, those
    inside functions too; `import a.b` gives ("a.b", ())."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.append((node.module, tuple(a.name for a in node.names)))
    return found


def imports_of_benchmarks(root: Path) -> list[str]:
    return sorted(f"{p.relative_to(root)}: {module}" for p in root.rglob("*.py")
                  for module, _ in absolute_imports(p) if module.split(".")[0] == "benchmarks")


def bench_internals(root: Path) -> list[str]:
    """Imports of specsample.bench's modules, or of names it does not publish."""
    from specsample.bench import PUBLIC

    wrong = []
    for p in root.rglob("*.py"):
        for module, names in absolute_imports(p):
            if module.startswith("specsample.bench.") or (module == "specsample.bench" and set(names) - set(PUBLIC)):
                wrong.append(f"{p.relative_to(root)}: {module} {', '.join(names)}".rstrip())
    return sorted(wrong)


def test_nothing_installed_imports_the_research_harness():
    assert (REPO / "benchmarks" / "__init__.py").exists() and imports_of_benchmarks(PACKAGE) == []


def test_the_studies_use_only_what_the_bench_publishes():
    studies = REPO / "benchmarks" / "studies"
    assert len(list(studies.glob("*.py"))) > 5 and bench_internals(studies) == []


def test_the_one_way_checks_find_a_backward_import(tmp_path):
    """Negative control: a package module importing benchmarks (inside a function), and
    a study reaching into a bench module or for a name the bench does not publish."""
    (tmp_path / "serve.py").write_text("def f():\n    from benchmarks.peers import x\n")
    (tmp_path / "study.py").write_text("from specsample.bench import markdown_table\n"
                                       "from specsample.bench.tables import cell\n"
                                       "from specsample.bench import main_table\n")
    assert imports_of_benchmarks(tmp_path) == ["serve.py: benchmarks.peers"]
    assert bench_internals(tmp_path) == ["study.py: specsample.bench main_table",
                                         "study.py: specsample.bench.tables cell"]
