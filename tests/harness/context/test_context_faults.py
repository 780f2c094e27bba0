"""Compression that keeps its promises (issue 12) and flat per-call cost (issue 18).

Scenarios also follow LangChain's SummarizationMiddleware tests: no trigger below the
threshold, trigger on tokens / message rounds, tool pairs never split at the cut, summary
failures leave history alone, the summary prompt gets the earlier history.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from evoharness.harness import EventLog
from evoharness.harness._messages import text_of
from evoharness.harness.context import (
    ContextConfig,
    ContextMiddleware,
    TokenCounter,
    is_context_overflow,
    repair_tool_pairs,
    safe_cut,
    tool_pairs_intact,
)
from evoharness.sdk.testing import ScriptedChatModel

SUMMARY = json.dumps({"user_need": "buy a kettle", "searched": ["pages"], "next_step": "pick"})
REQUEST = "Find me a kettle. Nothing made of plastic. Only buy from amazon or ebay."


@tool
def lookup(q: str) -> str:
    """Returns a medium result."""
    return f"result for {q}: " + "x" * 400


def calls(n: int, name: str = "lookup") -> list[Any]:
    return [
        AIMessage(
            content="",
            tool_calls=[{"name": name, "args": {"q": f"q{i}"}, "id": f"c{i}", "type": "tool_call"}],
        )
        for i in range(n)
    ] + ["done"]


def agent_run(
    mw: ContextMiddleware, script: list[Any], mode: str, *, system: str | None = None, tools=None
) -> tuple[ScriptedChatModel, dict[str, Any]]:
    model = ScriptedChatModel(script=script)
    agent = create_agent(model, tools or [lookup], system_prompt=system, middleware=[mw])
    payload = {"messages": [HumanMessage(REQUEST)]}
    out = agent.invoke(payload) if mode == "invoke" else asyncio.run(agent.ainvoke(payload))
    return model, out


def middleware(tmp_path: Path, summarizer: Any, events: EventLog | None = None, **cfg: Any) -> Any:
    base: dict[str, Any] = {
        "tail_trigger_tokens": 10**6,
        "total_trigger_tokens": 10**6,
        "keep_exchanges": 1,
        "offload_chars": None,
    }
    return ContextMiddleware(
        ContextConfig(**{**base, **cfg}),
        summarizer=summarizer,
        cold_dir=tmp_path,
        events=events or EventLog(),
    )


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_rounds_trigger_counts_rounds_since_the_last_summary(tmp_path: Path, mode: str) -> None:
    summ = ScriptedChatModel(policy=lambda m: SUMMARY)
    events = EventLog()
    mw = middleware(tmp_path, summ, events, rounds_trigger=4)
    agent_run(mw, calls(20), mode)
    rounds_between = []  # model calls between consecutive summaries
    last = 0
    ai_rounds = 0
    for e in events.events:
        if e.kind == "context_window":
            ai_rounds += 1
        if e.kind == "context_summary":
            rounds_between.append(ai_rounds - last)
            last = ai_rounds
    assert len(rounds_between) >= 4
    assert set(rounds_between[1:]) == {4}  # steady: every 4 rounds, not 5, 8, 13, ...


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_token_trigger_counts_system_prompt_and_tool_schemas(tmp_path: Path, mode: str) -> None:
    summ = ScriptedChatModel(policy=lambda m: SUMMARY)
    mw = middleware(tmp_path, summ, total_trigger_tokens=3000)
    system = "You are a shopping agent. " + " ".join(f"rule-{i}: check" for i in range(700))
    assert TokenCounter().text(system) > 3000
    _, out = agent_run(mw, calls(6), mode, system=system)
    # messages alone stay far below 3,000 tokens; the system prompt pushes the window over
    assert TokenCounter().messages(out["messages"]) < 3000
    assert out["compression_stats"]["summaries"] >= 1


class Overflowing(ScriptedChatModel):
    """Simulated provider: rejects any prompt with more than ``limit`` messages."""

    limit: int = 6

    def _next_reply(self, messages: list[BaseMessage]) -> AIMessage:
        if len(messages) > self.limit:
            raise ValueError(
                "Error code: 400 - This model's maximum context length is 8192 tokens "
                "(context_length_exceeded)"
            )
        return super()._next_reply(messages)


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_context_overflow_compresses_and_retries_once(tmp_path: Path, mode: str) -> None:
    events = EventLog()
    mw = middleware(tmp_path, ScriptedChatModel(policy=lambda m: SUMMARY), events)
    model = Overflowing(script=calls(6))
    agent = create_agent(model, [lookup], middleware=[mw])
    payload = {"messages": [HumanMessage(REQUEST)]}
    out = agent.invoke(payload) if mode == "invoke" else asyncio.run(agent.ainvoke(payload))
    assert out["messages"][-1].content == "done"
    assert events.counts()["context_overflow"] >= 1
    assert out["compression_stats"]["summaries"] >= 1  # summarised at the next round
    assert is_context_overflow(ValueError("prompt is too long: 210000 tokens > 200000"))
    assert not is_context_overflow(ValueError("rate limited"))


def test_other_model_errors_are_not_retried(tmp_path: Path) -> None:
    class Broken(ScriptedChatModel):
        def _next_reply(self, messages: list[BaseMessage]) -> AIMessage:
            raise RuntimeError("rate limited")

    mw = middleware(tmp_path, None)
    agent = create_agent(Broken(script=[]), [lookup], middleware=[mw])
    with pytest.raises(RuntimeError, match="rate limited"):
        agent.invoke({"messages": [HumanMessage("hi")]})


def random_history(rng: random.Random) -> list[BaseMessage]:
    out: list[BaseMessage] = [HumanMessage("start")]
    n = 0
    for _ in range(rng.randint(0, 25)):
        r = rng.random()
        if r < 0.45:
            k = rng.randint(1, 3)
            ids = [f"t{n + j}" for j in range(k)]
            n += k
            out.append(
                AIMessage(
                    content="",
                    tool_calls=[
                        {"name": "lookup", "args": {}, "id": i, "type": "tool_call"} for i in ids
                    ],
                )
            )
            for i in ids:
                if rng.random() < 0.85:
                    out.append(ToolMessage("r", tool_call_id=i, name="lookup"))
        elif r < 0.6:
            out.append(ToolMessage("orphan", tool_call_id=f"zz{n}", name="lookup"))
            n += 1
        elif r < 0.8:
            out.append(AIMessage(content="thinking"))
        else:
            out.append(HumanMessage("more"))
    rng.shuffle(out) if rng.random() < 0.1 else None
    return out


def test_kept_tail_never_orphans_or_drops_pending_calls_seeded() -> None:
    """Property test over 500 seeded random histories (hypothesis is not a dependency)."""
    for seed in range(500):
        rng = random.Random(seed)
        history = random_history(rng)
        keep = rng.randint(0, 4)
        cut = safe_cut(history, keep)
        kept = [m for m in history[:cut] if isinstance(m, HumanMessage)] + history[cut:]
        fixed = repair_tool_pairs(kept)
        assert tool_pairs_intact(fixed), seed
        last_ai = next((m for m in reversed(history) if isinstance(m, AIMessage)), None)
        if last_ai is not None and last_ai.tool_calls and history[-1] is last_ai:
            assert fixed[-1] is last_ai  # a pending call is never dropped nor answered
        answered = {m.tool_call_id for m in fixed if isinstance(m, ToolMessage)}
        tail = len(fixed)
        while tail and isinstance(fixed[tail - 1], ToolMessage):
            tail -= 1
        for m in fixed[: tail - 1]:  # every call but the pending one at the end is answered
            if isinstance(m, AIMessage):
                assert {c["id"] for c in m.tool_calls} <= answered, seed


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_failing_summariser_backs_off(tmp_path: Path, mode: str) -> None:
    asked: list[int] = []

    class Down(ScriptedChatModel):
        def _next_reply(self, messages: list[BaseMessage]) -> AIMessage:
            asked.append(len(messages))
            raise ConnectionError("summariser down")

    summ = Down(script=[])
    events = EventLog()
    mw = middleware(tmp_path, summ, events, rounds_trigger=1)
    _model, out = agent_run(mw, calls(30), mode)
    # without back-off it would be asked on (almost) every one of the 31 model calls
    assert 1 <= len(asked) <= 5
    assert sum(isinstance(m, ToolMessage) for m in out["messages"]) == 30  # history intact
    waits = [e.data["retry_in_rounds"] for e in events.of_kind("context_summary_failed")]
    assert waits == sorted(waits) and waits[0] == 2


@pytest.mark.parametrize("reply", ['{"user_need": ""}', "{}", '{"next_step": "go"}', ""])
def test_empty_or_degenerate_summary_is_rejected(tmp_path: Path, reply: str) -> None:
    events = EventLog()
    mw = middleware(tmp_path, ScriptedChatModel(policy=lambda m: reply), events, rounds_trigger=3)
    _, out = agent_run(mw, calls(6), "invoke")
    assert "stable_history_summary" not in (out.get("working_memory") or {})
    assert sum(isinstance(m, ToolMessage) for m in out["messages"]) == 6
    assert events.counts()["context_summary_failed"] >= 1


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_images_survive_compression(tmp_path: Path, mode: str) -> None:
    image = {"type": "image", "base64": "iVBORw0KGgo=", "mime_type": "image/png"}

    @tool(response_format="content_and_artifact")
    def camera(q: str) -> tuple[list[Any], str]:
        """Takes a photo."""
        return [{"type": "text", "text": "a photo"}, image], "raw"

    script = [
        AIMessage(
            content="",
            tool_calls=[{"name": "camera", "args": {"q": "x"}, "id": "p0", "type": "tool_call"}],
        ),
        *calls(6)[:-1],
        "done",
    ]
    mw = middleware(tmp_path, ScriptedChatModel(policy=lambda m: SUMMARY), rounds_trigger=4)
    model, out = agent_run(mw, script, mode, tools=[camera, lookup])
    assert out["compression_stats"]["summaries"] >= 1
    final_window = model.calls[-1]
    blocks = [
        b
        for m in final_window
        if isinstance(m.content, list)
        for b in m.content
        if isinstance(b, dict)
    ]
    assert any(b.get("type") == "image" for b in blocks)
    assert tool_pairs_intact(final_window)


def test_oversized_kept_exchange_is_offloaded_not_resummarised(tmp_path: Path) -> None:
    @tool
    def dump(q: str) -> str:
        """A huge result."""
        return " ".join(f"w{i}" for i in range(6000))

    lookups = calls(8)[:-1]
    big = AIMessage(
        content="",
        tool_calls=[{"name": "dump", "args": {"q": "all"}, "id": "d0", "type": "tool_call"}],
    )
    script = [*lookups[:2], big, *lookups[2:], "done"]
    summ = ScriptedChatModel(policy=lambda m: SUMMARY)
    events = EventLog()
    mw = middleware(tmp_path, summ, events, tail_trigger_tokens=3000, keep_exchanges=3)
    assert TokenCounter().text(dump.invoke({"q": "all"})) > 3000  # one exchange > trigger
    model, out = agent_run(mw, script, "invoke", tools=[dump, lookup])
    # summarised once; the kept huge result was offloaded, so the next rounds are under
    # the trigger instead of summarising again while it stays among the last 3 exchanges
    assert len(summ.calls) == 1
    (offload,) = events.of_kind("context_offload")
    assert offload.data["tool"] == "dump"
    assert all(TokenCounter().messages(w) < 3000 for w in model.calls[-4:])
    assert out["cold_data"]  # the reference is recorded in the state


def test_offload_failure_falls_back_to_truncation(tmp_path: Path) -> None:
    class FullDisk:
        def put(self, text: str) -> str:
            raise OSError(28, "No space left on device")

        def get(self, ref: str) -> str | None:
            return None

    @tool
    def big(q: str) -> str:
        """A bulky result with an undecodable name in it."""
        return "name=\udcff.txt " + "z" * 9000

    for store in (FullDisk(), None):
        events = EventLog()
        mw = ContextMiddleware(
            ContextConfig(offload_chars=1000), cold_store=store, cold_dir=tmp_path, events=events
        )
        script = [
            AIMessage(
                content="",
                tool_calls=[{"name": "big", "args": {"q": "a"}, "id": "b0", "type": "tool_call"}],
            ),
            "done",
        ]
        model = ScriptedChatModel(script=script)
        out = create_agent(model, [big], middleware=[mw]).invoke({"messages": [HumanMessage("go")]})
        result = next(m for m in out["messages"] if isinstance(m, ToolMessage))
        assert "[truncated:" in text_of(result) and len(text_of(result)) < 1200
        (failed,) = events.of_kind("context_offload_failed")
        assert failed.data["error"].startswith(("OSError", "UnicodeEncodeError"))


def test_window_metrics_are_per_session(tmp_path: Path) -> None:
    events = EventLog()
    mw = ContextMiddleware(cold_dir=tmp_path, events=events)
    agent = create_agent(ScriptedChatModel(policy=lambda m: "ok"), [lookup], middleware=[mw])
    for _ in range(2):  # two sessions with the same first message
        agent.invoke({"messages": [HumanMessage("same words")]})
    sessions = [e.data["session"] for e in events.of_kind("context_window")]
    assert len(set(sessions)) == 2
    assert all(e.data["shared_prefix_tokens"] == 0 for e in events.of_kind("context_window"))


def test_per_call_measurement_cost_is_flat(tmp_path: Path) -> None:
    """Counts operations, not time: the encoder runs only on messages new to the session."""
    encoded: list[int] = []

    def enc(text: str) -> int:
        encoded.append(len(text))
        return len(text) // 4

    counter = TokenCounter(encoder=enc)
    mw = ContextMiddleware(cold_dir=tmp_path, counter=counter)
    from langchain.agents.middleware import ModelRequest

    history: list[BaseMessage] = [HumanMessage("go", id="h0")]
    per_call = []
    for i in range(200):
        history += [
            AIMessage(
                content="",
                id=f"a{i}",
                tool_calls=[
                    {"name": "lookup", "args": {"q": i}, "id": f"c{i}", "type": "tool_call"}
                ],
            ),
            ToolMessage("r" * 50, tool_call_id=f"c{i}", id=f"t{i}"),
        ]
        before = len(encoded)
        req = ModelRequest(
            model=None,
            messages=list(history),
            system_message=None,
            tools=[],  # type: ignore[arg-type]
            state={"messages": history},
            runtime=None,
        )  # type: ignore[arg-type]
        mw._plan({"messages": history})  # type: ignore[arg-type]
        mw._measure(req)
        per_call.append(len(encoded) - before)
    assert max(per_call[10:]) <= 2  # the two new messages, whatever the session length
    # incremental == from scratch, also after the history is rebuilt (a summary's cut)
    fresh = TokenCounter(encoder=lambda t: len(t) // 4)
    assert mw._tails[history[0].id or ""].tokens[-1] == fresh.messages(history)
    rebuilt = [history[0], *history[-6:]]
    mw._plan({"messages": rebuilt})  # type: ignore[arg-type]
    ledger = mw._tails[history[0].id or ""]
    assert ledger.tokens[-1] == fresh.messages(rebuilt) and ledger.ais[-1] == 3
    assert [m for _, m in ledger.humans] == [history[0]]


def test_table_projection_keeps_every_value_in_fewer_tokens() -> None:
    from evoharness.harness.context import ProjectionRule, compact

    rows = [
        {"item_id": f"A-{i}", "title": f"kettle {i}", "price_cny": 100 + i, "note": "a|b"}
        for i in range(12)
    ]
    page = json.dumps({"page": 3, "results": rows})
    as_json = compact(page, ProjectionRule(tool="t", fields=["item_id", "price_cny", "note"]))
    table = compact(
        page, ProjectionRule(tool="t", fields=["item_id", "price_cny", "note"], format="table")
    )
    assert as_json is not None and table is not None
    lines = table.splitlines()
    assert lines[0] == "page: 3"
    assert lines[1] == "results (12 records; item_id | price_cny | note):"
    assert lines[2] == 'A-0 | 100 | "a|b"'  # a cell holding the separator is quoted
    counter = TokenCounter()
    assert counter.text(table) < 0.8 * counter.text(as_json)
    for r in rows:
        assert r["item_id"] in table and str(r["price_cny"]) in table
    assert "kettle" not in table  # projected away, as in JSON


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_restated_constraint_appears_once_and_is_flagged_after_a_summary(
    tmp_path: Path, mode: str
) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    summ = ScriptedChatModel(policy=lambda m: SUMMARY)
    mw = middleware(tmp_path, summ, rounds_trigger=3)
    model = ScriptedChatModel(script=[*calls(4)[:-1], "first", *calls(4)[:-1], "second"])
    agent = create_agent(model, [lookup], middleware=[mw], checkpointer=InMemorySaver())
    cfg: Any = {"configurable": {"thread_id": "r"}}
    second = "Change of plan: Only buy from ebay."
    for text in (REQUEST, second):
        payload = {"messages": [HumanMessage(text)]}
        if mode == "invoke":
            agent.invoke(payload, cfg)
        else:
            asyncio.run(agent.ainvoke(payload, cfg))
    last = "\n".join(text_of(m) for m in model.calls[-1])
    assert last.count("Only buy from amazon or ebay.") == 1
    assert last.count(second) == 1
    assert "Nothing made of plastic." in last
    assert "Restated later (the latest statement applies): platform" in last


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_no_summary_below_the_triggers_and_the_prompt_carries_history(
    tmp_path: Path, mode: str
) -> None:
    """LangChain's SummarizationMiddleware cases: nothing below the threshold; above it, the
    summariser sees the earlier history (and the previous summary, folded in)."""
    quiet = ScriptedChatModel(policy=lambda m: SUMMARY)
    _, out = agent_run(middleware(tmp_path, quiet), calls(8), mode)
    assert quiet.calls == [] and not out.get("compression_stats")
    asked = ScriptedChatModel(policy=lambda m: SUMMARY)
    agent_run(middleware(tmp_path, asked, rounds_trigger=3), calls(9), mode)
    assert len(asked.calls) >= 2
    first, second = (text_of(p[-1]) for p in asked.calls[:2])
    assert "AI called lookup" in first and "User: " + REQUEST in first
    assert second.startswith("Summary so far:\nUser need: buy a kettle")
