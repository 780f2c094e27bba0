"""How the CLI reports an error that ends a command: one line on stderr and an exit code.

The boundary in :func:`evoharness.sdk.cli.run_app` hands every error of the project's tree
(:class:`~evoharness.harness.errors.EvoharnessError`) and every error of bad input
(``OSError``, ``ValueError``, a SQLite file that is not a database) to :func:`error_line`
and :func:`exit_code`; ``--verbose`` or ``EVOHARNESS_DEBUG=1`` also prints the traceback
(:func:`wants_traceback`). Anything else is a bug and keeps its traceback.

Exit codes: 2 for misuse and bad input (the caller must change something: a
:class:`~evoharness.harness.errors.ConfigError`, a path that is a folder, a file that is not
text or not a database), 1 for work that failed (a
:class:`~evoharness.harness.errors.RunError`: the registry said no, an endpoint is down).
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Sequence

from evoharness.harness.errors import ConfigError, EvoharnessError, RunError

__all__ = ["DEBUG_ENV", "REPORTED", "error_line", "exit_code", "wants_traceback"]

DEBUG_ENV = "EVOHARNESS_DEBUG"
"""Set to 1 to see the traceback behind an error line (as ``--verbose`` does)."""

REPORTED: tuple[type[BaseException], ...] = (
    EvoharnessError,
    OSError,
    ValueError,
    sqlite3.DatabaseError,
)
"""What the boundary turns into one line; anything else is a bug and shows its traceback."""

MAX_CHARS = 600  # one line stays one line on a terminal of a few rows

# what to do about an OSError, by its class (the message says what happened)
_FIXES: dict[type[OSError], str] = {
    FileNotFoundError: "check the path",
    IsADirectoryError: "pass a file, not a folder",
    NotADirectoryError: "a part of the path is a file, not a folder",
    PermissionError: "check the file's permissions",
    FileExistsError: "choose a new name or remove it",
}


def wants_traceback(argv: Sequence[str]) -> bool:
    """``--verbose`` anywhere before a ``--`` in ``argv``, or ``EVOHARNESS_DEBUG`` set."""
    args = list(argv)
    options = args[: args.index("--")] if "--" in args else args
    return "--verbose" in options or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def exit_code(exc: BaseException) -> int:
    """1 for work that failed (a :class:`RunError`), 2 for misuse and bad input."""
    if isinstance(exc, ConfigError):
        return 2
    return 1 if isinstance(exc, RunError) else 2


def error_line(exc: BaseException, argv: Sequence[str]) -> str:
    """``exc`` as one line naming the option to blame (found in ``argv``) and the fix."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        path = os.fsdecode(exc.filename)
        fix = next((f for cls, f in _FIXES.items() if isinstance(exc, cls)), "check the path")
        line = f"{_blame(path, argv)}{path}: {exc.strerror.lower()}; {fix}"
    elif isinstance(exc, UnicodeDecodeError):
        line = f"a file is not UTF-8 text ({exc.reason} at byte {exc.start}); pass a text file"
    elif isinstance(exc, sqlite3.DatabaseError):
        line = (
            f"a database file is not usable: {exc}; pass the right file (--db, --state, "
            "--registry, ...) or move the damaged one away"
        )
    else:
        text = " ".join(part.strip() for part in str(exc).splitlines() if part.strip())
        what = type(exc).__name__
        line = text if isinstance(exc, EvoharnessError) and text else f"{what}: {text or what}"
        where = getattr(exc, "path", None)
        if isinstance(where, str | os.PathLike) and os.fspath(where) not in line:
            line = _blame(os.fspath(where), argv) + line
        field = getattr(exc, "field", None)
        flag = f"--{field.replace('_', '-')}" if isinstance(field, str) else None
        if flag and flag not in line and _passed(flag, argv):
            line = f"{flag}: {line}"
        kind, artifact = getattr(exc, "kind", None), getattr(exc, "name", None)
        if isinstance(exc, KeyError) and isinstance(kind, str) and isinstance(artifact, str):
            line = _with_commands(line, kind, artifact, getattr(exc, "label", None))
    if len(line) > MAX_CHARS:
        line = line[: MAX_CHARS - 1] + "…"
    if not isinstance(exc, EvoharnessError):  # not ours: the traceback may be worth seeing
        line += " (--verbose shows the traceback)"
    return line


def _passed(flag: str, argv: Sequence[str]) -> bool:
    return any(arg == flag or arg.startswith(f"{flag}=") for arg in argv)


def _with_commands(line: str, kind: str, name: str, label: object) -> str:
    """A registry look-up that found nothing, with the library's hints (Python calls such
    as ``registry.promote(...)``) replaced by the commands that do the same."""
    kept = [part for part in line.split("; ") if not re.search(r"\bregistry\.\w+\(", part)]
    if isinstance(label, str):
        hint = (
            f"point it at a version: evoharness registry promote {kind} {name} VERSION "
            f"--label {label or 'LABEL'} (history: evoharness registry events {kind} {name})"
        )
    else:
        hint = f"see what there is: evoharness registry versions {kind} {name}"
    return "; ".join([*kept, hint])


def _blame(path: str, argv: Sequence[str]) -> str:
    """``"--option "`` when ``argv`` passed ``path`` to an option (else nothing: a default)."""
    args = list(argv)
    for i, arg in enumerate(args):
        if arg.startswith("--") and "=" in arg and arg.partition("=")[2] == path:
            return f"{arg.partition('=')[0]} "
        if arg.startswith("-") and i + 1 < len(args) and args[i + 1] == path:
            return f"{arg} "
    return ""
