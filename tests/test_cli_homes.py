"""One CLI home per layer: every command of ``evoharness`` is defined in ``sdk/cli/`` (the SDK's
``run``, ``traces``, ``prompts``, ``registry``) or ``evolve/cli/`` (the groups the top layer
mounts), and the options several commands take read the same everywhere."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, get_args

import typer
from typer.models import OptionInfo

from evoharness.evolve import cli as evolve_cli
from evoharness.evolve.cli import options as evolve_options
from evoharness.sdk import cli as sdk_cli
from evoharness.sdk.cli import options, registry

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sdk", "harness", "evolve", "examples")
HOMES = {"sdk": "evoharness.sdk.cli", "evolve": "evoharness.evolve.cli"}


def commands(
    app: typer.Typer, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, Callable[..., Any]]]:
    """(``"group command"``, the function behind it) for every command of ``app``."""
    for info in app.registered_commands:
        assert info.callback is not None
        yield " ".join([*path, info.name or info.callback.__name__]), info.callback
    for group in app.registered_groups:
        assert group.name is not None and group.typer_instance is not None
        yield from commands(group.typer_instance, (*path, group.name))


def home(fn: Callable[..., Any]) -> str:
    return inspect.unwrap(fn).__module__


def test_every_sdk_command_lives_in_sdk_cli() -> None:
    sdk = dict(commands(sdk_cli.build_app()))
    assert {name.split()[0] for name in sdk} == {"run", "traces", "prompts", "registry"}
    strays = {name: home(fn) for name, fn in sdk.items() if not home(fn).startswith(HOMES["sdk"])}
    assert not strays, strays


def test_the_full_app_is_the_sdk_app_plus_commands_from_evolve_cli() -> None:
    sdk = dict(commands(sdk_cli.build_app()))
    full = dict(commands(evolve_cli.build_app()))
    assert set(sdk) <= set(full)
    assert all(full[name] is fn for name, fn in sdk.items())  # mounted, not redefined
    top = {name: home(fn) for name, fn in full.items() if name not in sdk}
    assert {"evolve judge", "evolve cycle", "bench overhead", "demo", "report"} <= set(top)
    strays = {name: where for name, where in top.items() if not where.startswith(HOMES["evolve"])}
    assert not strays, strays


def test_prompts_promote_and_rollback_are_the_registry_commands() -> None:
    full = dict(commands(evolve_cli.build_app()))
    for action in ("promote", "rollback"):
        assert inspect.unwrap(full[f"prompts {action}"]) is getattr(registry, action)
        assert inspect.unwrap(full[f"registry {action}"]) is getattr(registry, action)


def test_no_module_outside_the_cli_homes_uses_typer() -> None:
    homes = [ROOT / "sdk" / "cli", ROOT / "evolve" / "cli"]
    found = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if any(path.is_relative_to(h) for h in homes):
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = [node.module or ""]
                else:
                    continue
                if any(n == "typer" or n.startswith("typer.") for n in names):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"typer commands outside sdk/cli and evolve/cli: {found}"


def flags(fn: Callable[..., Any]) -> Iterator[tuple[str, Any]]:
    """(``--flag``, the parameter's annotation) for every option of a command."""
    for param in inspect.signature(fn, eval_str=True).parameters.values():
        info = next((m for m in get_args(param.annotation)[1:] if isinstance(m, OptionInfo)), None)
        if info is None:
            continue
        decls = [d for d in (info.param_decls or ()) if d.startswith("--")]
        if isinstance(info.default, str) and info.default.startswith("--"):
            decls.insert(0, info.default)  # Option("--flag") in Annotated: the name comes first
        yield (decls[0] if decls else "--" + param.name.replace("_", "-")), param.annotation


# options that mean the same wherever they appear: each is one alias; --db, --env, --label and
# --langfuse mean different things in different commands
SHARED = {
    "--registry": options.RegistryOption,
    "--concurrency": options.ConcurrencyOption,
    "--base-url": options.BaseUrlOption,
    "--api-key-env": options.ApiKeyEnvOption,
    "--tag": options.TagOption,
    "--actor": options.ActorOption,
    "--reason": options.ReasonOption,
    "--stages": options.StagesOption,
    "--min-dwell-s": options.MinDwellOption,
    "--tolerance": options.ToleranceOption,
    "--state": evolve_options.StateOption,
}


def test_shared_options_are_defined_once() -> None:
    uses: dict[str, list[str]] = {flag: [] for flag in SHARED}
    redefined = []
    for name, fn in commands(evolve_cli.build_app()):
        for flag, annotation in flags(fn):
            if flag in SHARED:
                uses[flag].append(name)
                if annotation is not SHARED[flag] and annotation != SHARED[flag]:
                    redefined.append(f"{name} {flag}")
    assert not redefined, redefined
    assert all(uses.values()), uses
    assert len(uses["--registry"]) >= 15  # prompts, registry, evolve, prompt-evolve, report, ...
