from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.messages import AIMessage


def tool_call(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    return AIMessage(
        content="", tool_calls=[{"name": name, "args": args, "id": call_id, "type": "tool_call"}]
    )


@pytest.fixture
def call() -> Callable[[str, dict[str, Any], str], AIMessage]:
    return tool_call


@pytest.fixture(params=["invoke", "ainvoke"])
def run(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """Invoke an agent (graph or EvoAgent) sync or async."""

    def go(agent: Any, payload: Any, config: Any = None) -> Any:
        if request.param == "invoke":
            return agent.invoke(payload, config)
        return asyncio.run(agent.ainvoke(payload, config))

    return go
