"""Package ``__init__`` files export lazily (``harness/lazy_exports.py``): importing a
package imports none of its modules, and the three lists of exports (the ``TYPE_CHECKING``
imports, ``__all__``, the map handed to ``lazy_exports``) agree."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from evoharness.harness.lazy_exports import lazy_exports

ROOT = Path(__file__).resolve().parents[1]
LAZY = [
    "harness/__init__.py",
    "harness/tracing/__init__.py",
    "sdk/__init__.py",
    "evolve/__init__.py",
]


def _lists(path: Path) -> tuple[set[tuple[str, str]], set[str], set[tuple[str, str]]]:
    """(module, name) imported under TYPE_CHECKING; __all__; (module, name) in _EXPORTS."""
    tree = ast.parse(path.read_text())
    typed: set[tuple[str, str]] = set()
    exported: set[str] = set()
    lazy: set[tuple[str, str]] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module
                typed |= {(imp.module, a.name) for a in imp.names}
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id == "__all__":
                exported = set(ast.literal_eval(node.value))
            elif node.targets[0].id == "_EXPORTS":
                lazy = {(m, n) for m, names in ast.literal_eval(node.value).items() for n in names}
    return typed, exported, lazy


@pytest.mark.parametrize("init", LAZY)
def test_the_three_lists_of_exports_agree(init: str) -> None:
    typed, exported, lazy = _lists(ROOT / init)
    assert typed and typed == lazy
    assert exported == {name for _, name in lazy}


def test_importing_a_package_imports_none_of_its_modules() -> None:
    code = (
        "import sys\n"
        "import evoharness.harness, evoharness.sdk, evoharness.evolve\n"
        "import evoharness.harness.tracing\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('langchain', 'langchain_core',"
        " 'langgraph', 'pydantic')]\n"
        "print(len(heavy), sorted(heavy)[:5])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("0 "), out.stdout


def test_a_name_is_imported_on_first_use_and_kept() -> None:
    import evoharness.sdk as sdk
    from evoharness.sdk.runner import run_tasks

    assert sdk.run_tasks is run_tasks and "run_tasks" in vars(sdk)
    assert {"run_tasks", "create_evo_agent"} <= set(dir(sdk))


def test_a_submodule_is_an_attribute_and_anything_else_is_not() -> None:
    getattr_, _ = lazy_exports("evoharness.harness", {})
    errors = getattr_("errors")
    assert errors is sys.modules["evoharness.harness.errors"]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        getattr_("nope")
    with pytest.raises(AttributeError):
        getattr_("__wrapped__")
