"""Package exports imported on first use (PEP 562), as LangChain's own packages do.

A package ``__init__`` that re-exports its modules' names eagerly makes ``import
evoharness.harness`` import LangChain's agent machinery (1.4 s of CPU), and every package
above pays it: the CLI's ``--help`` did, for nothing. A package instead lists its exports
three ways, each read by one tool: the imports under ``if TYPE_CHECKING:`` (type checkers),
the literal ``__all__`` (linters, ``import *``) and a map of module -> names handed to
:func:`lazy_exports` (the interpreter); ``tests/test_lazy_exports.py`` checks they agree.

Example::

    __getattr__, __dir__ = lazy_exports(__name__, {"evoharness.harness.errors": ("ConfigError",)})
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping, Sequence

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, Sequence[str]]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """A package's module ``__getattr__`` and ``__dir__`` for ``exports`` (module -> names).

    A name is imported from its module the first time it is read and then kept on the
    package. A name that is not exported but is a submodule is imported as one (an eager
    ``__init__`` imported most submodules as a side effect; code may rely on it).
    """
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> object:
        module = where.get(name)
        if module is not None:
            value = getattr(importlib.import_module(module), name)
        elif not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}"):
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    return __getattr__, __dir__
