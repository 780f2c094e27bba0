from __future__ import annotations

import importlib
import pickle

import pytest

from evoharness.harness.errors import RunError
from evoharness.sdk.prompts import PromptUnavailableError


@pytest.mark.parametrize("module", ["evoharness.sdk.prompts", "evoharness.sdk.rollout"])
def test_every_public_name_is_exported(module: str) -> None:
    mod = importlib.import_module(module)
    for name in mod.__all__:
        assert getattr(mod, name) is not None


def test_errors_pickle_with_their_attributes() -> None:
    err = PromptUnavailableError("down", name="shop", label="candidate")
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, RunError)
    assert (str(back), back.name, back.label) == ("down", "shop", "candidate")
