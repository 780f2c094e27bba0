"""A broken environment plugin is one ConfigError naming the plugin, the cause in one line
and the fix, from the run side's loader and from evolve's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from evoharness.evolve.environment import load_plugin
from evoharness.harness import ConfigError
from evoharness.sdk.environment import load_environment

PLUGINS = {
    "loader_raises": "raise RuntimeError('the plugin needs ORDERDESK_URL')\n",
    "loader_syntax": "def environment(:\n    pass\n",
    "loader_needs_args": "class Plugin:\n    def __init__(self, config):\n        pass\n",
    "loader_factory_raises": "def environment(**options):\n    raise KeyError('ORDERDESK_URL')\n",
}
CASES = [
    (
        "loader_raises:environment",
        ["RuntimeError: the plugin needs ORDERDESK_URL", "loader_raises.py:1"],
    ),
    ("loader_syntax:environment", ["syntax error in ", "loader_syntax.py line 1"]),
    ("loader_needs_args:Plugin", ["cannot be built with", "give its parameters defaults"]),
    ("loader_factory_raises:environment", ["failed while being built: KeyError: 'ORDERDESK_URL'"]),
    ("loader_missing.plugin:environment", ["no module named 'loader_missing'", "PYTHONPATH"]),
    (":", ["names no object", "package.module:Object"]),
    ("loader_raises:", ["names no object"]),
]


@pytest.fixture(autouse=True)
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, source in PLUGINS.items():
        (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))


LOADERS: list[Callable[[str], Any]] = [
    load_plugin,
    lambda spec: load_environment(spec, faults="none"),
]


@pytest.mark.parametrize("load", LOADERS, ids=["load_plugin", "load_environment"])
@pytest.mark.parametrize(("spec", "words"), CASES, ids=[c[0] for c in CASES])
def test_a_broken_plugin_is_one_config_error(
    load: Callable[[str], Any], spec: str, words: list[str]
) -> None:
    with pytest.raises(ConfigError) as caught:
        load(spec)
    message = str(caught.value)
    assert "\n" not in message and repr(spec) in message, message
    assert caught.value.field == "env"
    for word in words:
        assert word in message, (word, message)
