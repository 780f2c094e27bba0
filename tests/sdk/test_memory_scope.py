"""Memory reaches only sessions of its own case pattern: ``MemorySource(case_key=...)``
through ``create_evo_agent``. Strategies and lessons scoped to a pattern are served to its
sessions only; pattern-free entries and the user's preferences everywhere."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, SystemMessage

from evoharness.harness import ConfigError
from evoharness.harness.tracing import RunInfo, Tracer, TraceStore
from evoharness.sdk import create_evo_agent
from evoharness.sdk.memory import (
    MemoryEntry,
    MemoryRetriever,
    MemoryStore,
    SnapshotEntries,
    similarity,
)
from evoharness.sdk.registry import Registry, open_registry
from evoharness.sdk.session import MemorySource
from evoharness.sdk.testing import ScriptedChatModel

REFUND_STRATEGY = MemoryEntry(
    kind="strategy",
    query_pattern="refund",
    patterns=["refund"],
    summary="For refund requests, call lookup_order, then check_refund_policy, then "
    "issue_refund, then send_email.",
    tool_hints=["lookup_order", "check_refund_policy", "issue_refund", "send_email"],
    confidence=0.9,
)
EXCHANGE_STRATEGY = MemoryEntry(
    kind="strategy",
    query_pattern="exchange",
    patterns=["exchange"],
    summary="For exchange requests, call lookup_order, then create_exchange, then send_email.",
    tool_hints=["lookup_order", "create_exchange", "send_email"],
    confidence=0.9,
)
EXCHANGE_LESSON = MemoryEntry(
    kind="lesson",
    summary="Confirm the new size before you create the exchange.",
    patterns=["exchange"],
    confidence=0.9,
)
ORDER_LESSON = MemoryEntry(
    kind="lesson",
    summary="Look the order up before you change it.",
    patterns=["refund", "exchange"],
    confidence=0.8,
)
GLOBAL_LESSON = MemoryEntry(
    kind="lesson", summary="Reply to the customer with the order number.", confidence=0.7
)
LIKES_EMAIL = MemoryEntry(
    kind="preference", query_pattern="*", summary="Prefers email over phone.", user_id="u1"
)
ENTRIES = [REFUND_STRATEGY, EXCHANGE_STRATEGY, EXCHANGE_LESSON, ORDER_LESSON, GLOBAL_LESSON]


def plugin_case_key(query: str, metadata: Mapping[str, Any]) -> str:
    """What an environment plugin's case key looks like (query, trace metadata)."""
    return "exchange" if "exchange" in query.lower() else "refund"


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    reg = open_registry(tmp_path / "registry.db")
    memory = MemoryStore(tmp_path / "memory.db", registry=reg)
    memory.replace({e.id: e for e in [*ENTRIES, LIKES_EMAIL]})
    memory.close()
    yield reg
    reg.close()


def served(registry: Registry, source: MemorySource, request: str, **kw: Any) -> str:
    seen: list[str] = []

    def policy(messages: list[BaseMessage]) -> str:
        first = messages[0]
        seen.append(str(first.content) if isinstance(first, SystemMessage) else "")
        return "done"

    agent = create_evo_agent(
        ScriptedChatModel(policy=policy),
        system_prompt="You handle orders.",
        memory=source,
        registry=registry,
        **kw.pop("agent", {}),
    )
    agent.invoke(request, **kw)
    return seen[0]


@pytest.mark.parametrize(
    "case_key",
    [plugin_case_key, lambda request: plugin_case_key(request, {})],
    ids=["plugin (query, metadata)", "app (request)"],
)
def test_a_session_is_served_the_memory_of_its_own_pattern(
    registry: Registry, case_key: Any
) -> None:
    source = MemorySource(registry, "default", case_key=case_key)
    refund = served(registry, source, "Please refund my order 7", user_id="u1")
    assert REFUND_STRATEGY.summary in refund
    assert ORDER_LESSON.summary in refund and GLOBAL_LESSON.summary in refund
    assert EXCHANGE_STRATEGY.summary not in refund and EXCHANGE_LESSON.summary not in refund
    assert LIKES_EMAIL.summary in refund  # preferences go by user, whatever the pattern

    exchange = served(registry, source, "I want to exchange the shoes of my order", user_id="u2")
    assert EXCHANGE_STRATEGY.summary in exchange and EXCHANGE_LESSON.summary in exchange
    assert ORDER_LESSON.summary in exchange and GLOBAL_LESSON.summary in exchange
    assert REFUND_STRATEGY.summary not in exchange and LIKES_EMAIL.summary not in exchange


def test_without_a_case_key_every_entry_may_be_served(registry: Registry) -> None:
    text = served(registry, MemorySource(registry, "default"), "refund or exchange my order")
    assert REFUND_STRATEGY.summary in text and EXCHANGE_STRATEGY.summary in text


def test_the_case_key_reads_the_runs_trace_metadata(registry: Registry, tmp_path: Path) -> None:
    keys: list[Mapping[str, Any]] = []

    def by_task(query: str, metadata: Mapping[str, Any]) -> str:
        keys.append(dict(metadata))
        return str(metadata.get("kind", "refund"))

    store = TraceStore(tmp_path / "traces.db")
    text = served(
        registry,
        MemorySource(registry, "default", case_key=by_task),
        "Please help with order 7",
        run=RunInfo(run_id="r1", metadata={"kind": "exchange", "task_id": "t-9"}),
        agent={"tracer": Tracer(store)},
    )
    assert keys == [{"kind": "exchange", "task_id": "t-9"}]
    assert EXCHANGE_STRATEGY.summary in text and REFUND_STRATEGY.summary not in text
    assert store.flush()
    (trace,) = store.traces()
    assert EXCHANGE_STRATEGY.id in trace.skill_ids and REFUND_STRATEGY.id not in trace.skill_ids
    store.close()


def test_a_case_key_that_is_not_a_function_is_refused(registry: Registry) -> None:
    with pytest.raises(ConfigError, match="case_key must be a function"):
        MemorySource(registry, "default", case_key="refund")  # type: ignore[arg-type]


def test_scoped_retrieval_ranks_within_the_case_exactly() -> None:
    """The scoped index gives the entries an exhaustive ranking gives: every entry that
    applies to the case scored (Jaccard x confidence, the case's words on both sides for an
    entry of that case), top k, ties by id."""
    patterns = ("refund", "exchange", "returns")
    entries = [
        MemoryEntry(
            kind="lesson",
            summary=f"Check the order {w} before step {i}.",
            patterns=[p for j, p in enumerate(patterns) if (i >> j) & 1],
            confidence=0.3 + (i % 7) / 10,
        )
        for i, w in enumerate(["size", "price", "colour", "date", "label", "box"] * 6)
    ]
    snapshot = SnapshotEntries({e.id: e for e in entries}, version=1)
    scoped = MemoryRetriever(snapshot, k=3, scoped=True)
    exhaustive = MemoryRetriever(snapshot, k=3, scoped=True, similar=lambda a, b: similarity(a, b))
    for query in ("check the order size", "my refund label", "nothing in common"):
        for case in (*patterns, "other"):
            got = scoped.retrieve(query, case=case)
            want = exhaustive.retrieve(query, case=case)
            assert [e.id for e in got] == [e.id for e in want], (query, case)
            assert all(e.applies_to(case) for e in got)
    # an entry of the session's own pattern is relevant without sharing a word
    assert scoped.retrieve("nothing in common", case="refund")
    with pytest.raises(ValueError, match="scoped=True"):
        MemoryRetriever(snapshot).retrieve("x", case="refund")
