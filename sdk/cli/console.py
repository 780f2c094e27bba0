"""The one rich console every command prints to."""

from __future__ import annotations

from rich.console import Console

console = Console(soft_wrap=True)  # long report lines stay one line when piped
