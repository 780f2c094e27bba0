"""The parts of ``bfcl-eval`` the plugin uses: its data files and its AST checker.

``bfcl-eval`` ships every test entry and possible answer as JSON-lines files inside the
package, and grades single-turn categories in pure Python (``ast_checker``). Importing its
checker imports ``bfcl_eval.constants.model_config``, which imports the handler of every
model provider the leaderboard supports (anthropic, cohere, mistralai, google-genai, ...),
though the AST checker reads only one flag from it (``underscore_to_dot``, for models whose
API forbids dots in function names). When those provider SDKs are missing (``pip install
--no-deps bfcl-eval``, the light install this plugin documents), a stand-in module with
that flag off for every model is registered before the checker is imported; with the full
install the real module is used. The plugin passes the original (dotted) function names to
the checker, so the flag is off either way.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evoharness.harness import ConfigError

INSTALL = "pip install 'evoharness[bfcl]' (or: pip install --no-deps bfcl-eval==2026.3.23)"
VERSION_PREFIX = "BFCL_v4"


def available() -> bool:
    """Whether ``bfcl-eval`` is installed (found without importing it)."""
    return importlib.util.find_spec("bfcl_eval") is not None


def require() -> None:
    """Raise a :class:`ConfigError` with the install line when ``bfcl-eval`` is missing."""
    if not available():
        raise ConfigError(f"the bfcl environment needs bfcl-eval: {INSTALL}", field="env")


def data_dir() -> Path:
    """The folder of BFCL's test entries (``possible_answer/`` holds the answers)."""
    require()
    spec = importlib.util.find_spec("bfcl_eval")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """One JSON object per non-empty line."""
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@functools.cache
def entries(category: str) -> tuple[dict[str, Any], ...]:
    """BFCL's test entries of ``category`` (e.g. ``simple_python``), in file order."""
    return tuple(read_jsonl(data_dir() / f"{VERSION_PREFIX}_{category}.json"))


@functools.cache
def answers(category: str) -> dict[str, Any]:
    """Task id -> BFCL's ground truth for ``category``."""
    rows = read_jsonl(data_dir() / "possible_answer" / f"{VERSION_PREFIX}_{category}.json")
    return {r["id"]: r["ground_truth"] for r in rows}


@dataclass(frozen=True)
class _NoDotRenaming:
    underscore_to_dot: bool = False


class _AnyModel(dict[str, _NoDotRenaming]):
    def __missing__(self, key: str) -> _NoDotRenaming:
        return _NoDotRenaming()


def _import_checker() -> types.ModuleType:
    name = "bfcl_eval.constants.model_config"
    os.environ.setdefault("OPENAI_API_KEY", "unused")  # read by handlers at import time
    try:
        importlib.import_module(name)
    except ImportError:  # provider SDKs missing: the stand-in (see the module docs)
        for key in [k for k in sys.modules if k.startswith("bfcl_eval.model_handler")]:
            del sys.modules[key]  # half-imported handler packages of the failed import
        stub = types.ModuleType(name, "Stand-in: no model renames dots (evoharness bfcl).")
        stub.MODEL_CONFIG_MAPPING = _AnyModel()  # type: ignore[attr-defined]
        sys.modules[name] = stub
    return importlib.import_module("bfcl_eval.eval_checker.ast_eval.ast_checker")


@functools.cache
def ast_checker() -> Callable[..., dict[str, Any]]:
    """BFCL's ``ast_checker(func_description, model_output, possible_answer, language,
    test_category, model_name)``."""
    require()
    module = _import_checker()
    checker: Callable[..., dict[str, Any]] = module.ast_checker
    return checker


def python_language() -> Any:
    """BFCL's ``Language.PYTHON``."""
    require()
    return importlib.import_module("bfcl_eval.constants.enums").Language.PYTHON
