"""The full ``evoharness`` command line (the console script): the SDK's commands plus the
command groups of the layer above it.

:func:`build_app` makes a fresh app each call: the SDK's app
(:func:`evoharness.sdk.cli.build_app`: ``run``, ``traces``, ``prompts``, ``registry``) with
every group listed in :data:`GROUPS` and :data:`COMMANDS` mounted on it; no module mutates
another's app at import time. Every command of this layer is defined in this package.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import typer

from evoharness.evolve.cli import bench, demo, monitor, prompting, report
from evoharness.evolve.cli import evolve as evolve_cmd
from evoharness.sdk import cli as sdk_cli

__all__ = ["COMMANDS", "GROUPS", "build_app", "main"]

# Registration: one line per command group (name, Typer app) ...
GROUPS: list[tuple[str, typer.Typer]] = [
    ("evolve", evolve_cmd.app),
    ("bench", bench.app),
    ("prompt-evolve", prompting.app),
]
# ... and one line per top-level command (name, function).
COMMANDS: list[tuple[str, Callable[..., Any]]] = [
    ("demo", demo.demo),
    ("monitor", monitor.monitor),
    ("report", report.report),
]


def build_app() -> typer.Typer:
    """A fresh root app with every command group mounted."""
    app = sdk_cli.build_app()
    for name, group in GROUPS:
        app.add_typer(group, name=name)
    for name, fn in COMMANDS:
        app.command(name)(fn)
    return app


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``evoharness`` command: run the CLI on ``argv``, return the exit code."""
    return sdk_cli.run_app(build_app(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
