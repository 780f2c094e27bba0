"""The rooms of the layout and the way imports flow between them (checked on the ASTs).

- imports flow ``evolve -> sdk -> harness``, never back, and no package imports an
  environment (``examples``; they come in through the plugin protocol);
- ``evolve.demo``, ``evolve.benchmarks`` and ``evolve.cli`` are leaves: no product module
  imports them (lazy imports inside functions count), the benchmarks are imported by the CLI
  alone, and the demo by the CLI and the benchmarks;
- inside evolve a module imports from the module that defines a name, never through a room's
  ``__init__`` (the rooms' re-exports are for users; reaching through them would make the
  rooms' ``__init__`` files import each other, and the import order decide what works);
- evolve's top level keeps a handful of modules; everything else lives in a room.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .test_layering import ROOT, Check, _imported_module, _modules
from .test_layering import test_the_checks_catch_what_they_forbid as catches

LAYERS = ("harness", "sdk", "evolve")
"""Lowest first: a layer may import the ones before it."""
LEAVES = {
    "evoharness.evolve.demo": ("demo", "benchmarks", "cli"),
    "evoharness.evolve.benchmarks": ("benchmarks", "cli"),
    "evoharness.evolve.cli": ("cli",),
}
"""Each leaf, and the evolve rooms that may import it."""
LEAF_ROOMS = frozenset(name.rsplit(".", 1)[1] for name in LEAVES)
TOP_LEVEL_MODULES = 8


def _imports(module: str, path: Path, tree: ast.Module) -> Iterator[tuple[ast.AST, str, list[str]]]:
    """Every import anywhere in the tree (also inside functions): the node, the module it
    reads from, and the names it takes (``[]`` for ``import x``). A constant
    ``importlib.import_module("x")`` counts as ``import x``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            yield node, _imported_module(node, module, path), [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name, []
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name | ast.Attribute)
            and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr)
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node, node.args[0].value, []


def _targets(source: str, names: list[str]) -> list[str]:
    """The modules an import may load: the source, and ``source.name`` for each name (``from
    evoharness.evolve import demo`` loads the demo)."""
    return [source, *(f"{source}.{n}" for n in names)]


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _room(module: str) -> str | None:
    """The evolve room a module lives in (``evoharness.evolve.judging.jobs`` -> ``judging``;
    ``None`` for evolve's top-level modules and for other packages)."""
    parts = module.split(".")
    if parts[:2] != ["evoharness", "evolve"] or len(parts) < 3:
        return None
    return parts[2] if (ROOT / "evolve" / parts[2]).is_dir() else None


def upward_imports(path: Path, module: str, tree: ast.Module) -> list[str]:
    """Imports of a higher layer (``harness -> sdk``, ``sdk -> evolve``, ...) or of an
    environment package."""
    layer = module.split(".")[1]
    if layer not in LAYERS:
        return []
    higher = [f"evoharness.{p}" for p in (*LAYERS[LAYERS.index(layer) + 1 :], "examples")]
    return [
        f"{path.relative_to(ROOT)}: {source}"
        for _, source, names in _imports(module, path, tree)
        if any(_within(t, h) for t in _targets(source, names) for h in higher)
    ]


def leaf_imports(path: Path, module: str, tree: ast.Module) -> list[str]:
    """Imports of a leaf (demo, benchmarks, cli) from outside the rooms allowed to."""
    found = []
    for _, source, names in _imports(module, path, tree):
        for leaf, allowed in LEAVES.items():
            if _room(module) in allowed:
                continue
            if any(_within(t, leaf) for t in _targets(source, names)):
                found.append(f"{path.relative_to(ROOT)}: {source} ({leaf})")
    return found


def room_init_imports(path: Path, module: str, tree: ast.Module) -> list[str]:
    """Names an evolve product module takes from a room's ``__init__`` (instead of from the
    module that defines them)."""
    if not _within(module, "evoharness.evolve") or _room(module) in LEAF_ROOMS:
        return []
    found = []
    for node, source, names in _imports(module, path, tree):
        room = _room(source)
        if not isinstance(node, ast.ImportFrom) or room is None or source.count(".") != 2:
            continue  # not a ``from evoharness.evolve.<room> import ...``
        if path.name == "__init__.py" and _room(module) == room:
            continue  # a room's own __init__
        package = ROOT / "evolve" / room
        submodules = {p.stem for p in package.glob("*.py")} | {
            p.name for p in package.iterdir() if p.is_dir()
        }
        reached = [n for n in names if n not in submodules]
        if reached:
            found.append(f"{path.relative_to(ROOT)}: {', '.join(reached)} from {source}")
    return found


CHECKS = [upward_imports, leaf_imports, room_init_imports]


@pytest.mark.parametrize("check", CHECKS)
def test_imports_flow_one_way_between_rooms(check: Check) -> None:
    found = [f for path, module, tree in _modules() for f in check(path, module, tree)]
    assert not found, found


def _load_time_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports a module runs when it is loaded: not those in functions, nor those under
    ``if TYPE_CHECKING:``."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if ast.unparse(node.test) not in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                yield from _load_time_imports(node.body)
            yield from _load_time_imports(node.orelse)
        elif isinstance(node, ast.Try | ast.With | ast.ClassDef):
            for block in ("body", "orelse", "finalbody"):
                yield from _load_time_imports(getattr(node, block, []))
            for handler in getattr(node, "handlers", []):
                yield from _load_time_imports(handler.body)


def _unit(module: str) -> str | None:
    """What a module belongs to in the room graph: its room, or itself when it sits on
    evolve's top level (``None`` outside evolve, for evolve's own ``__init__`` and for a
    name that is no module)."""
    parts = module.split(".")
    if parts[:2] != ["evoharness", "evolve"] or len(parts) < 3:
        return None
    here = ROOT / "evolve" / parts[2]
    return parts[2] if here.is_dir() or here.with_suffix(".py").is_file() else None


def room_graph(modules: list[tuple[Path, str, ast.Module]]) -> dict[str, set[str]]:
    """Evolve's rooms (and top-level modules), each with those it imports at load time."""
    graph: dict[str, set[str]] = {}
    for path, module, tree in modules:
        unit = _unit(module)
        if unit is None:
            continue
        edges = graph.setdefault(unit, set())
        for node in _load_time_imports(tree.body):
            if isinstance(node, ast.ImportFrom):
                targets = _targets(
                    _imported_module(node, module, path), [a.name for a in node.names]
                )
            else:
                targets = [a.name for a in node.names]
            edges |= {u for u in map(_unit, targets) if u is not None and u != unit}
    return graph


def cycle_in(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (``[a, b, ..., a]``), or ``None``."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_rooms_import_each_other_without_a_cycle() -> None:
    """A room's ``__init__`` imports its modules; a circle of rooms would make whichever is
    imported first fail (a name read from a half-initialised module)."""
    assert cycle_in(room_graph(_modules())) is None


def test_every_evolve_module_imports_first() -> None:
    """In one fresh interpreter: each evolve module imported as the first of evolve's, with
    the others forgotten in between (what a worker process or a lazy ``__init__`` does)."""
    code = """
import importlib, sys
bad = []
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m.split(".")[:2] == ["evoharness", "evolve"]]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:  # an extra that is not installed is not our business
        if (exc.name or "").startswith("evoharness"):
            bad.append(f"{name}: {exc!r}")
    except Exception as exc:
        bad.append(f"{name}: {exc!r}")
print("\\n".join(bad))
"""
    names = [m for _, m, _ in _modules() if m.startswith("evoharness.evolve")]
    done = subprocess.run(
        [sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert not done.stdout.strip(), done.stdout


def test_evolve_top_level_is_a_handful_of_modules() -> None:
    top = sorted(p.name for p in (ROOT / "evolve").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= TOP_LEVEL_MODULES, f"{len(top)} modules on evolve's top level: {top}"


@pytest.mark.parametrize(
    ("check", "file", "source", "caught"),
    [
        (upward_imports, "harness/x.py", "from evoharness.sdk.agent import EvoAgent", True),
        (upward_imports, "sdk/x.py", "def f():\n    import evoharness.evolve.cycle", True),
        (upward_imports, "sdk/x.py", "from evoharness import evolve", True),
        (upward_imports, "evolve/x.py", "from evoharness.examples.shop import plugin", True),
        (upward_imports, "evolve/x.py", "from evoharness.sdk import create_evo_agent", False),
        (upward_imports, "examples/x.py", "from evoharness.evolve import Episode", False),
        (
            upward_imports,
            "harness/x.py",
            "import importlib\nimportlib.import_module('evoharness.sdk.agent')",
            True,
        ),
        (leaf_imports, "evolve/cycle.py", "from evoharness.evolve.demo import run_demo", True),
        (leaf_imports, "evolve/prompting/x.py", "def f():\n    from ..demo import cycle", True),
        (leaf_imports, "evolve/x.py", "from evoharness.evolve import benchmarks", True),
        (leaf_imports, "evolve/demo/x.py", "from evoharness.evolve.benchmarks import w", True),
        (leaf_imports, "sdk/x.py", "from evoharness.evolve.cli import main", True),
        (leaf_imports, "evolve/cli/x.py", "from evoharness.evolve.benchmarks import w", False),
        (leaf_imports, "evolve/benchmarks/x.py", "from evoharness.evolve.demo import d", False),
        (leaf_imports, "evolve/x.py", "from evoharness.evolve.cycle import run_cycle", False),
        (room_init_imports, "evolve/cycle.py", "from evoharness.evolve.monitor import X", True),
        (room_init_imports, "evolve/x.py", "from .judging import judge", False),  # a module
        (
            room_init_imports,
            "evolve/cycle.py",
            "from evoharness.evolve.monitor.findings import X",
            False,
        ),
        (room_init_imports, "evolve/monitor/__init__.py", "from .checks import X", False),
        (room_init_imports, "evolve/cli/x.py", "from evoharness.evolve.monitor import X", False),
    ],
)
def test_the_checks_catch_what_they_forbid(
    check: Check, file: str, source: str, caught: bool
) -> None:
    catches(check, file, source, caught)  # the layering test's harness for its own checks
