"""Opening the SQLite files a command's options name, with bad files refused in one line.

A path that is a folder, or a file that is not a SQLite database, is a
:class:`~evoharness.harness.errors.ConfigError` naming the option (``--state x: not a SQLite
database ...``) instead of a raw ``sqlite3.DatabaseError`` from deep inside a store.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from evoharness.harness.errors import ConfigError

if TYPE_CHECKING:
    from evoharness.harness.tracing import TraceStore

__all__ = ["SQLITE_HEADER", "opened", "sqlite_file", "trace_store"]

T = TypeVar("T")


def opened(option: str, path: Path, open_: Callable[[Path], T]) -> T:
    """``open_(path)``; a folder at ``path``, or a file SQLite cannot read, is a ConfigError
    naming ``option`` and the fix."""
    sqlite_file(option, path)
    try:
        return open_(path)
    except sqlite3.DatabaseError as exc:  # includes OperationalError: cannot open
        raise ConfigError(
            f"{option} {path} is not a usable SQLite database ({exc}); pass the right file or "
            "move this one away (a new one is created where none exists)",
            field=option,
        ) from exc


def trace_store(db: Path, *, option: str = "--db") -> TraceStore:
    """The trace store at ``db``, which must exist (reading commands never create one)."""
    from evoharness.harness.tracing import TraceStore

    if not db.exists():
        raise ConfigError(
            f"no trace store at {db}; run `evoharness run` first or pass {option}", field=option
        )
    return opened(option, db, TraceStore)


SQLITE_HEADER = b"SQLite format 3\x00"


def sqlite_file(option: str, path: Path | None) -> Path | None:
    """``path`` checked without opening it: a folder, or a file that is not SQLite, is a
    ConfigError naming ``option`` (no file or an empty one is fine: a store starts there).

    For stores a command opens later, or only on some paths: the check comes first."""
    if path is None or not path.exists():
        return path
    if path.is_dir():
        raise ConfigError(f"{option} {path} is a folder; pass a SQLite file", field=option)
    with path.open("rb") as f:
        head = f.read(len(SQLITE_HEADER))
    if head and head != SQLITE_HEADER:
        raise ConfigError(
            f"{option} {path} is not a SQLite database; pass the right file or move this one "
            "away (a new one is created where none exists)",
            field=option,
        )
    return path
