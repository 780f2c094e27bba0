"""CPU serving: tool-call parsing, adapter hot-swap, session pinning (tiny model)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool

from evoharness.harness import ConfigError
from evoharness.sdk.serving.local import BASE, SessionRouter, parse_tool_calls, to_chat


def test_parse_valid_and_invalid_tool_calls() -> None:
    text = (
        'Let me look.\n<tool_call>\n{"name": "search", "arguments": {"q": "kettle"}}\n</tool_call>'
        '\n<tool_call>\n{"name": "calc", "arguments": "{\\"x\\": 1}"}\n</tool_call>'
        '\n<tool_call>\n{"name": "broken", "arguments": {"q": </tool_call>'
        "\n<tool_call>\n[1, 2]\n</tool_call>"
    )
    content, calls, invalid = parse_tool_calls(text)
    assert content == "Let me look."
    assert [(c["name"], c["args"]) for c in calls] == [
        ("search", {"q": "kettle"}),
        ("calc", {"x": 1}),
    ]
    assert [i["name"] for i in invalid] == ["broken", None]
    assert all(i["error"] for i in invalid)
    assert len({c["id"] for c in calls} | {i["id"] for i in invalid}) == 4
    # an unterminated block at the end of a truncated completion still parses
    _, calls, _ = parse_tool_calls('<tool_call>\n{"name": "a", "arguments": {}}')
    assert [c["name"] for c in calls] == ["a"]
    assert parse_tool_calls("just words") == ("just words", [], [])


def test_session_router_pins_sessions() -> None:
    router = SessionRouter()
    assert router.version_for("a") == BASE
    router.activate("p-v1")
    assert router.version_for("a") == BASE and router.version_for("b") == "p-v1"
    assert router.version_for(None) == "p-v1"
    assert router.pinned() == {BASE: 1, "p-v1": 1}
    assert router.release("a") == BASE
    assert router.version_for("a") == "p-v1"


def test_hot_swap_and_session_pinning(served: tuple[str, str, str]) -> None:
    from evoharness.sdk.serving.local import AdapterPool, LocalChatModel

    base, v1, v2 = served
    pool = AdapterPool(base, dtype="float32", threads=1)
    router = SessionRouter()
    model = LocalChatModel(pool=pool, router=router, max_new_tokens=6)
    prompt = [SystemMessage("be brief"), HumanMessage("hi")]

    def ask(session: str) -> tuple[str, list[int]]:
        reply = model.invoke(prompt, config={"configurable": {"thread_id": session}})
        meta = reply.response_metadata
        assert meta["prompt_token_ids"] and reply.usage_metadata
        return meta["adapter"], meta["completion_token_ids"]

    base_version, base_ids = ask("early")
    assert base_version == BASE
    pool.load("p-v1", v1)
    pool.load("p-v2", v2)
    router.activate("p-v1")
    assert ask("s1")[0] == "p-v1"
    v1_ids = ask("s1")[1]
    router.activate("p-v2")  # hot swap: new sessions get v2, s1 and "early" keep theirs
    assert ask("s2")[0] == "p-v2"
    v2_ids = ask("s2")[1]
    assert ask("s1") == ("p-v1", v1_ids)
    assert ask("early") == (BASE, base_ids)  # the base model with adapters disabled
    assert len({tuple(base_ids), tuple(v1_ids), tuple(v2_ids)}) == 3  # distinct weights
    assert pool.swap_seconds  # set_adapter ran between versions
    with pytest.raises(ConfigError, match="immutable"):
        pool.load("p-v1", v2)
    pool.unload("p-v1")  # s1 falls back to what was active before v1: the base model
    assert ask("s1") == (BASE, base_ids)


def test_tools_are_rendered_by_the_chat_template(served: tuple[str, str, str]) -> None:
    from evoharness.sdk.serving.local import AdapterPool, LocalChatModel

    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    pool = AdapterPool(served[0], dtype="float32", threads=1)
    bound = LocalChatModel(pool=pool, max_new_tokens=4).bind_tools([add])
    reply = bound.invoke([HumanMessage("2+2?")])
    prompt = pool.tokenizer.decode(reply.response_metadata["prompt_token_ids"])
    assert "<tools>" in prompt and '"name": "add"' in prompt
    chat = to_chat([reply, HumanMessage("x")])
    assert chat[0]["role"] == "assistant" and json.dumps(chat)


def test_to_chat_keeps_argument_order_and_shows_malformed_replies_as_written() -> None:
    from evoharness.harness.control.reply_check import MALFORMED_KEY

    ok = AIMessage(
        content="",
        tool_calls=[{"name": "f", "args": {"b": 1, "a": {"z": 0, "y": 1}}, "id": "c1"}],
    )
    raw = '<tool_call>\n{"name": "f", "arguments": {"a": }\n</tool_call>'
    broken = AIMessage(
        content="",
        tool_calls=[{"name": "f", "args": {}, "id": "c2"}],  # the harness's converted call
        response_metadata={MALFORMED_KEY: [{"id": "c2"}], "raw_text": raw + "\n"},
    )
    chat = to_chat([ok, broken])
    args = chat[0]["tool_calls"][0]["function"]["arguments"]
    assert json.dumps(args) == '{"b": 1, "a": {"z": 0, "y": 1}}'  # as written, as traces store
    assert chat[1] == {"role": "assistant", "content": raw}  # no empty-argument call


class _TextPool:
    """A pool stand-in that answers with fixed completion texts and records the chats."""

    base_model = "text"

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.chats: list[list[dict[str, Any]]] = []

    def generate(
        self, messages: list[dict[str, Any]], **_: Any
    ) -> tuple[str, list[int], list[int]]:
        self.chats.append(messages)
        return self.texts[len(self.chats) - 1], [1], [2]


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_malformed_call_is_retried_seeing_what_was_written(mode: str) -> None:
    from langchain.agents import create_agent

    from evoharness.harness import ReplyCheckMiddleware
    from evoharness.sdk.serving.local import LocalChatModel

    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    broken = '<tool_call>\n{"name": "add", "arguments": {"a": 2 "b": 2}}\n</tool_call>'
    pool = _TextPool(
        [broken, '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 2}}\n</tool_call>', "4"]
    )
    agent = create_agent(
        LocalChatModel(pool=pool), [add], middleware=[ReplyCheckMiddleware(terminal_tool=None)]
    )
    request = {"messages": [HumanMessage("2+2?")]}
    out = agent.invoke(request) if mode == "invoke" else asyncio.run(agent.ainvoke(request))
    assert out["messages"][-1].content == "4"
    second = pool.chats[1]
    assert second[1] == {"role": "assistant", "content": broken}
    assert "could not be parsed" in second[2]["content"]
    assert all("tool_calls" not in m for m in second)  # no call with empty arguments shown


def test_prefix_cache_gives_the_same_completion_with_fewer_prefilled_tokens(
    served: tuple[str, str, str],
) -> None:
    from evoharness.sdk.serving.local import AdapterPool

    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    pools = [AdapterPool(served[0], dtype="float32", threads=1, prefix_cache=n) for n in (4, 0)]
    pools[0].load("p-v1", served[1])
    replies = []
    for pool in pools:
        chat = list(first)
        texts = []
        for version in (BASE, BASE, "p-v1", BASE):
            if version != BASE and version not in pool.adapters:
                pool.load(version, served[1])
            text, prompt, completion = pool.generate(chat, version=version, max_new_tokens=5)
            texts.append((text, prompt, completion))
            chat += [{"role": "assistant", "content": text}, {"role": "user", "content": "more"}]
        replies.append(texts)
    cached, plain = pools
    assert replies[0] == replies[1]  # caching changes cost, never the tokens
    assert cached.prefill_tokens < plain.prefill_tokens
    assert plain.prefill_tokens == sum(len(p) for _, p, _ in replies[1])


def test_a_batch_completes_each_chat_as_one_by_one(served: tuple[str, str, str]) -> None:
    from evoharness.sdk.serving.local import AdapterPool

    pool = AdapterPool(served[0], dtype="float32", threads=1, prefix_cache=0)
    pool.load("p-v1", served[1])
    chats: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = [
        ([{"role": "user", "content": "hi"}], None),
        (
            [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "a longer one"},
            ],
            None,
        ),
        ([{"role": "user", "content": "hello hello hello"}], None),
    ]
    for version in (BASE, "p-v1"):
        batched = pool.generate_batch(chats, version=version, max_new_tokens=6)
        single = [pool.generate(m, tools=t, version=version, max_new_tokens=6) for m, t in chats]
        assert batched == single
    assert pool.generate_batch([], version=BASE) == []
