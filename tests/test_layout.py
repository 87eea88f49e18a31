"""The package stays readable at a glance: few modules at its top (the rest sit in the
folder of their layer), no module a reader cannot hold, no function longer than a
screen, and no exported name that is also a module's."""

import ast
from pathlib import Path

import pytest

import specsample

pytestmark = pytest.mark.pure

PACKAGE = Path(specsample.__file__).parent
TOP_MODULES, MODULE_LINES, FUNCTION_LINES = 8, 450, 60


def long_functions(root: Path = PACKAGE, limit: int = FUNCTION_LINES) -> list[str]:
    """'path:line name (n lines)' for each function or method over `limit` lines,
    decorators and docstring included."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                if node.end_lineno - first + 1 > limit:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({node.end_lineno - first + 1} lines)")
    return found


def test_few_modules_at_the_top():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(top) <= TOP_MODULES, top


def test_no_module_is_too_long():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MODULE_LINES}
    assert long == {}


def test_no_function_is_too_long():
    assert long_functions() == []


def test_the_length_check_counts_a_long_function(tmp_path):
    """Negative control: a 61-line function, decorator and docstring included, is found."""
    body = "\n".join(f"    x{i} = {i}" for i in range(58))
    (tmp_path / "m.py").write_text(f'@staticmethod\ndef f():\n    """Doc."""\n{body}\n')
    assert long_functions(tmp_path) == ["m.py:2 f (61 lines)"]


def test_the_public_names_are_not_module_names():
    """specsample.generate is the function: no module or folder at the top has a name
    the package exports, so `import specsample.x` and `specsample.x` mean one thing."""
    modules = {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert set(specsample.__all__) & modules == set()
    assert callable(specsample.generate) and callable(specsample.verify)
