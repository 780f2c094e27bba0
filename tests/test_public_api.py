"""Every public name is exported from its package `__init__`."""

from __future__ import annotations

import importlib
import inspect

import pytest

import evoharness.harness as harness
from evoharness.harness import errors


@pytest.mark.parametrize(
    "package",
    ["evoharness.sdk", "evoharness.harness", "evoharness.evolve", "evoharness.sdk.testing"],
)
def test_all_names_resolve(package: str) -> None:
    module = importlib.import_module(package)
    for name in module.__all__:
        assert hasattr(module, name), f"{package}.__all__ lists missing {name}"


def test_every_exception_is_exported() -> None:
    exceptions = {
        n
        for n, o in inspect.getmembers(errors, inspect.isclass)
        if issubclass(o, Exception) and o.__module__ == errors.__name__
    }
    assert exceptions <= set(harness.__all__)


def test_evolve_exceptions_are_exported() -> None:
    import evoharness.evolve as evolve
    from evoharness.evolve.judging import judge

    found = {
        n
        for n, o in inspect.getmembers(judge, inspect.isclass)
        if issubclass(o, Exception) and o.__module__ == judge.__name__
    }
    assert found and found <= set(evolve.__all__)


def test_missing_extra_names_the_install_line() -> None:
    with pytest.raises(harness.MissingExtraError) as err:
        harness.require_extra("definitely_not_installed_mod", extra="train", feature="Training")
    assert "pip install 'evoharness[train]'" in str(err.value)
    assert err.value.extra == "train"


def test_every_public_exception_pickles_with_its_attributes() -> None:
    import pickle

    from evoharness.evolve.judging.judge import JudgeFailure
    from evoharness.harness import (
        ConfigError,
        HookError,
        MissingExtraError,
        RunError,
    )
    from evoharness.sdk.testing import ScriptExhaustedError

    samples = [
        ConfigError("bad option", field="x"),
        MissingExtraError(extra="ray", module="ray", feature="Ray executor"),
        HookError("hook failed", point="pre_tool_call", hook="h"),
        ScriptExhaustedError(3),
        RunError("failed"),
        JudgeFailure("unparsable", trace_id="t1", attempts=2),
    ]
    for exc in samples:
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc)
        assert str(back) == str(exc)
        assert back.__dict__ == exc.__dict__
    assert issubclass(HookError, RunError)
    assert not issubclass(RunError, ConfigError)
