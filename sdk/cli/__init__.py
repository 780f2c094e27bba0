"""The ``evoharness`` command line: the root app, the SDK's commands, and the entry shell.

The console script lives in the top layer (:mod:`evoharness.evolve.cli`), which builds a fresh
app with :func:`build_app`, mounts its own command groups on it and runs it with
:func:`run_app`. Nothing here mutates an app at import time, and nothing looks up modules of a
higher layer. Commands return exit codes: 0 on success, 1 when the work failed, 2 for bad
arguments or configuration (one clear line on stderr).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.metadata import version
from typing import Annotated

import typer
from rich.console import Console

from evoharness.harness import ConfigError
from evoharness.sdk.cli import run as run_cmd
from evoharness.sdk.cli import traces
from evoharness.sdk.cli.traces import TRACE_DB
from evoharness.sdk.runtime import inline_untraced_bookkeeping

__all__ = ["TRACE_DB", "build_app", "console", "main", "run_app"]

console = Console(soft_wrap=True)  # long report lines stay one line when piped


def _version(value: bool) -> None:
    if value:
        console.print(f"evoharness {version('evoharness')}")
        raise typer.Exit(0)


def _root(
    show_version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print version.")
    ] = False,
) -> None:
    """evoharness: a production harness for LangChain agents."""


def build_app() -> typer.Typer:
    """A fresh root app with the SDK's commands (``run``, ``traces``)."""
    app = typer.Typer(
        name="evoharness",
        help="Run agents inside the evoharness harness and evolve them from their traces.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    app.callback()(_root)
    app.command("run")(run_cmd.run)
    app.add_typer(traces.app, name="traces")
    return app


def run_app(app: typer.Typer, argv: Sequence[str] | None = None) -> int:
    """Run ``app`` on ``argv`` and map errors onto exit codes (2: usage or configuration)."""
    args = list(sys.argv[1:] if argv is None else argv) or ["--help"]
    inline_untraced_bookkeeping()  # this process is ours: cheaper async middleware
    try:
        result = app(args=args, prog_name="evoharness", standalone_mode=False)
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        console.print("aborted", style="red")
        return 130
    except typer.TyperException as exc:  # click usage errors: bad option, bad value
        sys.stderr.write(f"evoharness: error: {exc.format_message()}\n")
        return 2 if exc.exit_code == 2 else 1
    except ConfigError as exc:
        sys.stderr.write(f"evoharness: error: {exc}\n")
        return 2
    finally:
        inline_untraced_bookkeeping(False)
    return result if isinstance(result, int) else 0


def main(argv: Sequence[str] | None = None) -> int:
    """The SDK-only CLI (``run``, ``traces``); the full CLI is ``evoharness.evolve.cli.main``."""
    return run_app(build_app(), argv)
