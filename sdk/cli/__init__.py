"""The ``evoharness`` command line: the root app, the SDK's commands, and the entry shell.

Every SDK command lives in this package, one module per command or group (``run``,
``traces``, ``prompts``, ``registry``); the options several commands take are defined once in
:mod:`~evoharness.sdk.cli.options`. The console script lives in the top layer
(:mod:`evoharness.evolve.cli`), which builds a fresh app with :func:`build_app`, mounts its
own command groups on it and runs it with :func:`run_app`. Nothing here mutates an app at
import time, and nothing looks up modules of a higher layer. Commands return exit codes: 0 on
success, 1 when the work failed, 2 for bad arguments or configuration (one clear line on
stderr).
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence
from importlib.metadata import version
from typing import Annotated

import typer

from evoharness.sdk.cli import prompts, registry, traces
from evoharness.sdk.cli import run as run_cmd
from evoharness.sdk.cli.console import console
from evoharness.sdk.cli.error_line import (
    DEBUG_ENV,
    REPORTED,
    error_line,
    exit_code,
    wants_traceback,
)
from evoharness.sdk.cli.options import TRACE_DB, finite_numbers
from evoharness.sdk.runtime import inline_untraced_bookkeeping

__all__ = ["GROUPS", "NAMES", "TRACE_DB", "build_app", "command_of", "console", "main", "run_app"]

# The SDK's command groups (name, Typer app); ``run`` is a single command.
GROUPS: list[tuple[str, typer.Typer]] = [
    ("traces", traces.app),
    ("prompts", prompts.app),
    ("registry", registry.app),
]
NAMES = ["run", *(name for name, _ in GROUPS)]
"""Every top-level command and group of :func:`build_app`."""


def _version(value: bool) -> None:
    if value:
        console.print(f"evoharness {version('evoharness')}")
        raise typer.Exit(0)


def _root(
    show_version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print version.")
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose", help=f"Print the traceback behind an error line (or {DEBUG_ENV}=1)."
        ),
    ] = False,
) -> None:
    """evoharness: a production harness for LangChain agents."""


def build_app(only: str | None = None) -> typer.Typer:
    """A fresh root app with the SDK's commands (``run``, ``traces``, ``prompts``, ``registry``).

    With ``only``, the root and that one command or group: what one invocation needs (typer
    reads every mounted command's signature on each call; see :func:`command_of`).
    """
    app = typer.Typer(
        name="evoharness",
        help="Run agents inside the evoharness harness and evolve them from their traces.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    app.callback()(_root)
    if only in (None, "run"):
        app.command("run")(run_cmd.run)
    for name, group in GROUPS:
        if only in (None, name):
            app.add_typer(group, name=name)
    return app


def command_of(argv: Sequence[str], names: Sequence[str]) -> str | None:
    """The command or group ``argv`` invokes, when it is one of ``names`` (the root options
    take no values, so it is the first word that is not an option); else ``None``: the
    root's help, or an unknown command whose error lists them all."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in names else None


def run_app(app: typer.Typer, argv: Sequence[str] | None = None) -> int:
    """Run ``app`` on ``argv`` and map errors onto exit codes and one line on stderr.

    2: usage, configuration or bad input; 1: the work failed; 130: interrupted. With
    ``--verbose`` (or ``EVOHARNESS_DEBUG=1``) the traceback comes first.
    """
    args = list(sys.argv[1:] if argv is None else argv) or ["--help"]
    inline_untraced_bookkeeping()  # this process is ours: cheaper async middleware
    try:
        command = finite_numbers(typer.main.get_command(app))
        result = command(args=args, prog_name="evoharness", standalone_mode=False)
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        console.print("aborted", style="red")
        return 130
    except typer.TyperException as exc:  # click usage errors: bad option, bad value
        sys.stderr.write(f"evoharness: error: {exc.format_message()}\n")
        return 2 if exc.exit_code == 2 else 1
    except KeyboardInterrupt:
        sys.stderr.write("evoharness: interrupted\n")
        return 130
    except REPORTED as exc:  # the project's errors and bad input: one line, never a traceback
        if wants_traceback(args):
            traceback.print_exc()
        sys.stderr.write(f"evoharness: error: {error_line(exc, args)}\n")
        return exit_code(exc)
    finally:
        inline_untraced_bookkeeping(False)
    return result if isinstance(result, int) else 0


def main(argv: Sequence[str] | None = None) -> int:
    """The SDK-only CLI (:func:`build_app`); the full CLI is ``evoharness.evolve.cli.main``."""
    args = list(sys.argv[1:] if argv is None else argv)
    return run_app(build_app(command_of(args, NAMES)), args)
