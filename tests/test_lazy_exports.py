"""Package ``__init__`` files export lazily (``harness/lazy_exports.py``): importing a
package imports none of its modules, and the three lists of exports (the ``TYPE_CHECKING``
imports, ``__all__``, the map handed to ``lazy_exports``) agree."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from evoharness.harness.lazy_exports import lazy_exports

ROOT = Path(__file__).resolve().parents[1]
LAZY = [
    "harness/__init__.py",
    "harness/breaker/__init__.py",
    "harness/control/__init__.py",
    "harness/governance/__init__.py",
    "harness/hooks/__init__.py",
    "harness/tracing/__init__.py",
    "sdk/__init__.py",
    "evolve/__init__.py",
]


def _typed(path: Path) -> set[tuple[str, str]]:
    """(module, name) imported under TYPE_CHECKING; a ``*`` import of a lazy package stands
    for the names in its ``__all__``."""
    typed: set[tuple[str, str]] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module
                for alias in imp.names:
                    names = (
                        importlib.import_module(imp.module).__all__
                        if alias.name == "*"
                        else [alias.name]
                    )
                    typed |= {(imp.module, name) for name in names}
    return typed


@pytest.mark.parametrize("init", LAZY)
def test_the_three_lists_of_exports_agree(init: str) -> None:
    package = importlib.import_module(".".join(("evoharness", *Path(init).parent.parts)))
    lazy = {(module, n) for module, names in package._EXPORTS.items() for n in names}
    typed = _typed(ROOT / init)
    assert typed and typed == lazy
    assert sorted(package.__all__) == sorted(name for _, name in lazy)


def test_the_harness_re_exports_its_sub_packages_lists() -> None:
    import evoharness.harness as harness
    from evoharness.harness import breaker, hooks

    assert set(breaker.__all__) | set(hooks.__all__) <= set(harness.__all__)
    assert harness.HookRegistry is hooks.HookRegistry
    assert harness.CircuitBreakerMiddleware is breaker.CircuitBreakerMiddleware


def test_importing_a_package_imports_none_of_its_modules() -> None:
    code = (
        "import sys\n"
        "import evoharness.harness, evoharness.sdk, evoharness.evolve\n"
        "import evoharness.harness.breaker, evoharness.harness.control\n"
        "import evoharness.harness.governance, evoharness.harness.hooks\n"
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
