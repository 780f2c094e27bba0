"""The one rich console every command prints to."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console

if TYPE_CHECKING:
    from rich.progress import Progress

__all__ = ["console", "progress_bar"]

console = Console(soft_wrap=True)  # long report lines stay one line when piped


def progress_bar(description: str = "[bold]{task.description}") -> Progress:
    """A transient bar on :data:`console`: what, the bar, done of total, time so far."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn(description),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
