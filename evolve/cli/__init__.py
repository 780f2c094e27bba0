"""The full ``evoharness`` command line (the console script): the SDK's commands plus the
command groups of the layer above it.

:func:`build_app` makes a fresh app each call: the SDK's app
(:func:`evoharness.sdk.cli.build_app`: ``run``, ``traces``, ``prompts``, ``registry``) with
every group listed in :data:`GROUPS` and :data:`COMMANDS` mounted on it; no module mutates
another's app at import time. Every command of this layer is defined in this package.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import typer

from evoharness.evolve.cli import bench, demo, monitor, prompting, report, rollout, weights
from evoharness.evolve.cli import evolve as evolve_cmd
from evoharness.sdk import cli as sdk_cli

__all__ = ["COMMANDS", "GROUPS", "build_app", "main"]

# Registration: one line per command group (name, Typer app) ...
GROUPS: list[tuple[str, typer.Typer]] = [
    ("evolve", evolve_cmd.app),
    ("bench", bench.app),
    ("prompt-evolve", prompting.app),
    ("weights", weights.app),
    ("rollout", rollout.app),
]
# ... and one line per top-level command (name, function).
COMMANDS: list[tuple[str, Callable[..., Any]]] = [
    ("demo", demo.demo),
    ("monitor", monitor.monitor),
    ("report", report.report),
]


def build_app(only: str | None = None) -> typer.Typer:
    """A fresh root app with every command group mounted (with ``only``: that one)."""
    mine = only is not None and only not in sdk_cli.NAMES
    app = sdk_cli.build_app("" if mine else only)  # "": none of the SDK's
    for name, group in GROUPS:
        if only in (None, name):
            app.add_typer(group, name=name)
    for name, fn in COMMANDS:
        if only in (None, name):
            app.command(name)(fn)
    return app


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``evoharness`` command: run the CLI on ``argv``, return the exit code.

    Only the invoked command is mounted (its signature is all typer needs to read); the
    root's help and an unknown command see them all."""
    args = list(sys.argv[1:] if argv is None else argv)
    names = [*sdk_cli.NAMES, *(n for n, _ in GROUPS), *(n for n, _ in COMMANDS)]
    return sdk_cli.run_app(build_app(sdk_cli.command_of(args, names)), args)


if __name__ == "__main__":
    raise SystemExit(main())
