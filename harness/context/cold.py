"""L0 offload: bulky tool results go to a cold store; the window keeps a summary + reference."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Protocol

from langchain_core.tools import BaseTool, StructuredTool
from pydantic import BaseModel, Field


class ColdStore(Protocol):
    """Where offloaded results live."""

    def put(self, text: str) -> str:
        """Store ``text``; returns its reference."""
        ...

    def get(self, ref: str) -> str | None:
        """The text for ``ref``, or ``None``."""
        ...


class FileColdStore:
    """Content-addressed files under ``directory`` (the same text gets the same reference)."""

    def __init__(self, directory: Path | str) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def put(self, text: str) -> str:
        ref = "cold-" + hashlib.sha256(text.encode()).hexdigest()[:16]
        path = self.dir / f"{ref}.txt"
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(path)
        return ref

    def get(self, ref: str) -> str | None:
        if not ref.startswith("cold-") or "/" in ref or ".." in ref:
            return None
        path = self.dir / f"{ref}.txt"
        return path.read_text() if path.exists() else None


class ReadArgs(BaseModel):
    ref: str = Field(description="The reference shown in an offloaded result, e.g. cold-1a2b...")
    offset: int = Field(0, ge=0, description="Character offset to start from")
    limit: int = Field(4000, ge=100, le=20_000, description="Characters to return")


READ_TOOL = "read_reference"


def read_reference_tool(store: ColdStore) -> BaseTool:
    """The tool that lets the model read an offloaded result back, a page at a time."""

    def read(ref: str, offset: int = 0, limit: int = 4000) -> str:
        text = store.get(ref)
        if text is None:
            return f"Unknown reference {ref!r}."
        page = text[offset : offset + limit]
        more = len(text) - offset - len(page)
        tail = f"\n[{more} more characters: call {READ_TOOL} with offset={offset + len(page)}]"
        return page + (tail if more > 0 else "")

    return StructuredTool.from_function(
        func=read,
        name=READ_TOOL,
        args_schema=ReadArgs,
        description="Read an offloaded (too large) tool result back by its reference.",
    )


def offload_summary(text: str, ref: str, *, preview_chars: int = 600) -> str:
    """What stays in the window instead of a bulky result."""
    return (
        f"{text[:preview_chars]}\n[offloaded: {len(text)} characters stored as {ref}; "
        f'call {READ_TOOL}(ref="{ref}") to read it]'
    )
