"""Every ``python`` block in docs/ runs, or says just above it why it does not.

A block runs in a fresh interpreter with ``tmp_path`` as its working directory (no network:
the docs' examples use the scripted model). A block that cannot run alone (a fragment, one
that needs Redis or a real model) carries ``<!-- not-run: <reason> -->`` on the line above.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_BLOCK = re.compile(r"(?:<!--\s*(not-run)\b:?([^\n]*?)-->\n)?```python\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class Block:
    """One fenced ``python`` block: where it is, its code and the mark just above it."""

    path: Path
    line: int
    code: str
    mark: str | None
    reason: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def python_blocks(path: Path) -> list[Block]:
    """Every ``python`` block of ``path``, with an HTML-comment mark on the line above it."""
    text = path.read_text()
    return [
        Block(
            path, text[: m.start(3)].count("\n"), m.group(3), m.group(1), (m.group(2) or "").strip()
        )
        for m in _BLOCK.finditer(text)
    ]


def run_block(code: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with ``cwd`` as the working directory."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


BLOCKS = [block for page in sorted((ROOT / "docs").glob("*.md")) for block in python_blocks(page)]


def test_the_docs_have_blocks() -> None:
    assert len(BLOCKS) >= 10


@pytest.mark.parametrize("block", BLOCKS, ids=[b.where for b in BLOCKS])
def test_a_docs_block_runs_or_is_marked_with_a_reason(block: Block, tmp_path: Path) -> None:
    if block.mark is not None:
        assert block.mark == "not-run", f"{block.where}: unknown mark {block.mark!r}"
        assert block.reason, f"{block.where}: a not-run mark needs a reason"
        return
    done = run_block(block.code, tmp_path)
    assert done.returncode == 0, f"{block.where} failed:\n{done.stderr}"


def test_a_mark_without_a_reason_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- not-run -->\n```python\nx\n```\n<!-- not-run: needs Redis -->\n"
        "```python\ny\n```\n```python\nz = 1\n```\n"
    )
    first, second, third = python_blocks(page)
    assert (first.mark, first.reason) == ("not-run", "")
    assert (second.mark, second.reason) == ("not-run", "needs Redis")
    assert third.mark is None and third.code == "z = 1\n"
