"""A tiny Llama + a tokenizer trained on the spot (skips without the train extra), and a
TraceSource over a fixed list of episodes."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from evoharness.evolve.episodes.traces import Episode, EpisodeFilter

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "first"},
                    "b": {"type": "integer", "description": "second"},
                },
                "required": ["a", "b"],
            },
        },
    }
]


class Source:
    """A TraceSource over a fixed list of episodes (the protocol is the only contract)."""

    def __init__(self, episodes: list[Episode]) -> None:
        self.items = episodes

    def episodes(self, where: EpisodeFilter | None = None) -> Iterator[Episode]:
        w = where or EpisodeFilter()
        return (e for e in self.items if w.matches(e))


def conversation(a: int, b: int) -> list[dict[str, Any]]:
    """One tool-using conversation: ask, call add, read the result, answer."""
    return [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": f"what is {a} plus {b}?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}
            ],
        },
        {"role": "tool", "name": "add", "content": str(a + b)},
        {"role": "assistant", "content": f"The answer is {a + b}."},
    ]


def sft_rows() -> list[dict[str, Any]]:
    return [{"messages": conversation(a, b), "tools": TOOLS} for a in range(4) for b in range(3)]


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A ~100K-parameter Llama saved with its tokenizer (built once per session)."""
    for module in ("torch", "transformers", "trl", "peft", "datasets"):
        pytest.importorskip(module, reason="the train extra is not installed (see docs/weights.md)")
    from evoharness.evolve.weights.tiny import build_tiny_model

    corpus = [json.dumps(r) for r in sft_rows()] * 2
    corpus.append("<tool_call>\n</tool_call> <tool_response>\n</tool_response> The answer is")
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", corpus))
