"""Under ``ainvoke``, blocking context work (cold-store writes, memory recall) runs off the
event loop's thread."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from evoharness.harness.context import (
    ContextConfig,
    ContextMiddleware,
    FileColdStore,
    ReferenceMiddleware,
)
from evoharness.sdk.testing import ScriptedChatModel

BULK = "record " * 2_000


@tool
def search(query: str) -> str:
    """Return a bulky result."""
    return BULK


class RecordingColdStore(FileColdStore):
    """A file cold store that remembers which thread wrote."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.writer_threads: list[int] = []

    def put(self, text: str) -> str:
        self.writer_threads.append(threading.get_ident())
        return super().put(text)


def _policy(messages: list[BaseMessage]) -> AIMessage:
    if isinstance(messages[-1], HumanMessage):
        return AIMessage(
            content="",
            tool_calls=[
                {"name": "search", "args": {"query": "x"}, "id": "c1", "type": "tool_call"}
            ],
        )
    return AIMessage(content="done")


async def test_offload_writes_happen_off_the_event_loop(tmp_path: Path) -> None:
    cold = RecordingColdStore(tmp_path)
    mw = ContextMiddleware(ContextConfig(offload_chars=1000), cold_store=cold)
    agent = create_agent(ScriptedChatModel(policy=_policy), [search], middleware=[mw])
    out = await agent.ainvoke({"messages": [HumanMessage("find records")]})
    offloaded = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    assert len(str(offloaded.content)) < len(BULK)
    assert cold.writer_threads and threading.get_ident() not in cold.writer_threads


async def test_memory_recall_runs_off_the_event_loop() -> None:
    seen: list[int] = []

    def provider(query: str, user_id: str | None) -> tuple[list[str], str]:
        seen.append(threading.get_ident())
        return ["m1"], "Always confirm the budget."

    captured: dict[str, Any] = {}

    def policy(messages: list[BaseMessage]) -> AIMessage:
        captured["system"] = str(messages[0].content)
        return AIMessage(content="ok")

    agent = create_agent(
        ScriptedChatModel(policy=policy), [], middleware=[ReferenceMiddleware(provider)]
    )
    await agent.ainvoke({"messages": [HumanMessage("buy a kettle")]})
    assert seen and threading.get_ident() not in seen
    assert "Always confirm the budget." in captured["system"]
