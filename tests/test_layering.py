"""Packages meet through public names only (checked on the ASTs, nothing is imported).

- no package imports another package's private (``_x``) modules;
- no package ``__init__`` re-exports a name it imported from a private module, its own or
  another package's (a helper worth exporting lives in a public module: what an
  ``__init__`` exports, other packages import, and a private module is nobody's API);
- no module imports a private ``_name`` from another package's module.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sdk", "harness", "evolve", "examples")

Check = Callable[[Path, str, ast.Module], list[str]]


@functools.cache
def _modules() -> list[tuple[Path, str, ast.Module]]:
    """Every module of the packages: its file, its dotted name, its syntax tree."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            tree = ast.parse(path.read_text(), str(path))
            found.append((path, ".".join(("evoharness", *parts)), tree))
    return found


def _imported_module(node: ast.ImportFrom, module: str, path: Path) -> str:
    """The absolute name of the module a ``from ... import`` reads from."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if path.name != "__init__.py":
        base = base[:-1]  # a plain module's package
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _private_owner(module: str) -> str | None:
    """The package whose private module (or subpackage) ``module`` is; ``None`` if public."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_"):
            return ".".join(parts[:i])
    return None


def _exported(tree: ast.Module) -> set[str] | None:
    """The names in a module's literal ``__all__``, or ``None`` when it has none."""
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                return {str(v) for v in ast.literal_eval(node.value)}
    return None


def private_module_imports(path: Path, module: str, tree: ast.Module) -> list[str]:
    """Imports of another package's private modules."""
    found = []
    package = module.split(".")[1]
    for node in ast.walk(tree):
        names = (
            [_imported_module(node, module, path)]
            if isinstance(node, ast.ImportFrom)
            else [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else []
        )
        for name in names:
            parts = name.split(".")
            if parts[0] != "evoharness" or len(parts) < 3 or parts[1] == package:
                continue
            if any(p.startswith("_") for p in parts[2:]):
                found.append(f"{path.relative_to(ROOT)}: {name}")
    return found


def private_re_exports(path: Path, module: str, tree: ast.Module) -> list[str]:
    """Names a package ``__init__`` exports from a private module (any package's)."""
    if path.name != "__init__.py":
        return []
    found = []
    exported = _exported(tree)
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom):
            continue
        source = _imported_module(node, module, path)
        owner = _private_owner(source)
        if not source.startswith("evoharness.") or owner is None:
            continue
        for alias in node.names:
            shown = alias.asname or alias.name
            if shown in exported if exported is not None else not shown.startswith("_"):
                found.append(f"{path.relative_to(ROOT)}: {shown} from {source}")
    return found


def private_name_imports(path: Path, module: str, tree: ast.Module) -> list[str]:
    """Private ``_names`` imported from another package's modules."""
    found = []
    package = module.split(".")[1]
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        source = _imported_module(node, module, path)
        parts = source.split(".")
        if parts[0] != "evoharness" or len(parts) < 2 or parts[1] == package:
            continue
        for alias in node.names:
            if alias.name.startswith("_") and not alias.name.startswith("__"):
                found.append(f"{path.relative_to(ROOT)}: {alias.name} from {source}")
    return found


CHECKS = [private_module_imports, private_re_exports, private_name_imports]


@pytest.mark.parametrize("check", CHECKS)
def test_packages_meet_through_public_names(check: Check) -> None:
    found = [f for path, module, tree in _modules() for f in check(path, module, tree)]
    assert not found, found


@pytest.mark.parametrize(
    ("check", "file", "source", "caught"),
    [
        (private_module_imports, "sdk/x.py", "from evoharness.harness._json import f", True),
        (private_module_imports, "harness/x.py", "from evoharness.harness._json import f", False),
        (
            private_re_exports,
            "harness/__init__.py",
            "from evoharness.harness.tracing._tables import connect\n__all__ = ['connect']",
            True,
        ),
        (
            private_re_exports,
            "harness/tracing/__init__.py",
            "from ._tables import connect\n__all__ = ['connect']",
            True,  # its own private module: still not an API to hand out
        ),
        # without __all__, every public name an __init__ imports is exported
        (private_re_exports, "harness/__init__.py", "from .tracing._tables import connect", True),
        (private_re_exports, "harness/__init__.py", "from .tracing._tables import _hidden", False),
        (
            private_re_exports,
            "harness/__init__.py",
            "from evoharness.harness.tracing._tables import connect\n__all__ = []",
            False,  # imported for its own use, not exported
        ),
        (private_name_imports, "evolve/x.py", "from evoharness.sdk.agent import _stack", True),
        (private_name_imports, "sdk/x.py", "from evoharness.sdk.agent import _stack", False),
        (private_name_imports, "evolve/x.py", "from evoharness.sdk import __version__", False),
    ],
)
def test_the_checks_catch_what_they_forbid(
    check: Check, file: str, source: str, caught: bool
) -> None:
    path = ROOT / file
    parts = Path(file).with_suffix("").parts
    module = ".".join(("evoharness", *(parts[:-1] if parts[-1] == "__init__" else parts)))
    assert bool(check(path, module, ast.parse(source))) is caught
