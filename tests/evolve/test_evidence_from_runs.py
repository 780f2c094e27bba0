"""Harness interventions recorded in a real traced run come back as episode evidence."""

from __future__ import annotations

from pathlib import Path

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from evoharness.evolve.episodes.traces import LocalTraceSource
from evoharness.harness import HarnessConfig, default_middleware
from evoharness.harness.tracing import Tracer, TraceStore
from evoharness.sdk import create_evo_agent
from evoharness.sdk.testing import ScriptedChatModel


def test_a_reply_cut_off_at_the_token_limit_is_evidence(tmp_path: Path) -> None:
    def policy(messages: list[BaseMessage]) -> AIMessage:
        return AIMessage(
            content="The best kettle is the", response_metadata={"finish_reason": "length"}
        )

    store = TraceStore(tmp_path / "t.db")
    agent = create_evo_agent(
        ScriptedChatModel(policy=policy),
        [],
        middleware=default_middleware(HarnessConfig()),
        tracer=Tracer(store),
    )
    agent.invoke({"messages": [HumanMessage("recommend a kettle")]}, user_id="u1")
    assert store.flush(10)
    (episode,) = list(LocalTraceSource(store).episodes())
    assert "truncated" in episode.evidence.kinds()
    store.close(5)
