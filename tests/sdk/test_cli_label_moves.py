"""``prompts promote|rollback`` are ``registry promote|rollback`` with the kind fixed: the same
options, the same output, the same audit log; a prompt's active label moves through its
rollout whichever door it is moved through."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from evoharness.evolve.cli import main
from evoharness.sdk.cli import prompts, registry
from evoharness.sdk.prompts import PromptTemplate, RegistryPromptStore
from evoharness.sdk.registry import open_registry
from evoharness.sdk.rollout import RolloutController


def prompts_command(name: str) -> Callable[..., Any]:
    found = next(c.callback for c in prompts.app.registered_commands if c.name == name)
    assert found is not None
    return found


@pytest.mark.parametrize("action", ["promote", "rollback"])
def test_the_prompt_commands_take_the_registry_commands_options(action: str) -> None:
    shared = getattr(registry, action)
    bound = prompts_command(action)
    assert inspect.unwrap(bound) is shared
    kind, *rest = inspect.signature(shared, eval_str=True).parameters.values()
    assert kind.name == "kind"
    assert list(inspect.signature(bound).parameters.values()) == rest


def _shop_in_rollout(path: Path) -> str:
    """A registry with prompt ``shop`` v1 active and v2 in a running rollout."""
    with open_registry(path) as reg:
        store = RegistryPromptStore(reg)
        store.promote("shop", store.create("shop", PromptTemplate.from_text("Be brief.")).version)
        v2 = store.create("shop", PromptTemplate.from_text("Be brief and kind.")).version
        RolloutController(reg).start("shop", v2, min_dwell_s=0)
    return f"--registry={path}"


def _moves(
    door: Callable[[str], list[str]], at: str, capsys: pytest.CaptureFixture[str]
) -> list[str]:
    """Promote the rollout's candidate, roll back, promote v2 again: what each step printed."""
    printed = []
    for action, *rest in (("promote",), ("rollback", "-m", "bad"), ("promote", "2")):
        assert main([*door(action), "shop", *rest, at]) == 0
        printed.append(capsys.readouterr().out)
    return printed


def test_both_doors_print_and_audit_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _shop_in_rollout(tmp_path / "a.db")
    b = _shop_in_rollout(tmp_path / "b.db")
    printed = _moves(lambda action: ["prompts", action], a, capsys)
    assert _moves(lambda action: ["registry", action, "prompt"], b, capsys) == printed
    assert printed == [
        "prompt/shop active: v2 (was v1)\npromote: manual: manual promote; active is v2\n",
        "prompt/shop active: v1 (was v2)\nrollback: manual: bad (restored v1); active is v1\n",
        "prompt/shop active: v2 (was v1)\npromote: manual: manual promote (v2 active); "
        "active is v2\n",
    ]

    def log(path: Path) -> list[tuple[object, ...]]:
        with open_registry(path) as reg:
            return [
                (e.action, e.label, e.version, e.previous, e.actor, e.reason)
                for e in reg.events("prompt", "shop")
            ]

    assert log(tmp_path / "a.db") == log(tmp_path / "b.db")
    assert ("rollback", "active", 1, 2, "cli", "bad") in log(tmp_path / "a.db")


def test_the_registry_door_settles_a_running_rollout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    at = _shop_in_rollout(tmp_path / "r.db")
    assert main(["registry", "rollback", "prompt", "shop", at]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "prompt/shop active: v1 (was v1)",
        "rollback: manual: manual rollback; active is v1",
    ]
    with open_registry(tmp_path / "r.db") as reg:
        experiment = RolloutController(reg).current("shop")
        assert experiment is not None and experiment.status == "rolled_back"
        assert "candidate" not in RegistryPromptStore(reg).labels("shop")


def test_other_kinds_move_their_label_directly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    at = f"--registry={tmp_path / 'r.db'}"
    with open_registry(tmp_path / "r.db") as reg:
        for n in (1, 2):
            reg.publish("guard_rules", "default", {"rules": n})
    assert main(["registry", "promote", "guard_rules", "default", "2", "--label", "prod", at]) == 0
    assert capsys.readouterr().out == "guard_rules/default prod: v2 (was nothing)\n"
    assert main(["registry", "promote", "guard_rules", "default", at]) == 2
    assert "name the version of guard_rules/default to promote" in capsys.readouterr().err
    assert main(["registry", "rollback", "guard_rules", "default", "--langfuse", at]) == 2
    assert "--langfuse moves the active label of a prompt only" in capsys.readouterr().err
    with open_registry(tmp_path / "r.db") as reg:
        assert [e.reason for e in reg.events("guard_rules", "default") if e.label] == [
            "manual promote"
        ]
