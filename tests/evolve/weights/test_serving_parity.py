"""Training and serving see the same tokens for the same conversation.

A shop task is run through the real harness by the SIMULATED offline policy, served through
:class:`LocalChatModel` (real prompt encoding by :class:`AdapterPool`, scripted reply text),
and traced. The SFT row built from that trace is tokenised by the training path; every prompt
the serving path encoded must be exactly the training ids up to the assistant turn it asked
for, and that turn must be what training learns (assistant mask starts right there).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from evoharness.evolve.episodes.traces import EpisodeFilter, LocalTraceSource
from evoharness.evolve.weights.datasets import Gates, build_sft, tool_schemas
from evoharness.harness.tracing import Tracer, TraceStore
from evoharness.sdk.environment import load_environment
from evoharness.sdk.runner import run_tasks


def _from_chat(messages: list[dict[str, Any]]) -> list[BaseMessage]:
    """Chat-template messages back as LangChain messages (tool-call ids by position)."""
    out: list[BaseMessage] = []
    pending: list[str] = []
    for i, m in enumerate(messages):
        if m["role"] == "system":
            out.append(SystemMessage(m["content"]))
        elif m["role"] == "user":
            out.append(HumanMessage(m["content"]))
        elif m["role"] == "assistant":
            calls = [
                {
                    "name": c["function"]["name"],
                    "args": c["function"]["arguments"],
                    "id": f"c{i}-{j}",
                    "type": "tool_call",
                }
                for j, c in enumerate(m.get("tool_calls", []))
            ]
            pending = [str(c["id"]) for c in calls]
            out.append(AIMessage(content=m["content"], tool_calls=calls))
        else:
            out.append(ToolMessage(m["content"], tool_call_id=pending.pop(0), name=m["name"]))
    return out


class ScriptedPool:
    """An ``AdapterPool`` stand-in: the real pool encodes the prompt, the simulated policy
    writes the reply as the text a model would (``<tool_call>`` blocks)."""

    def __init__(self, pool: Any, policy: BaseChatModel) -> None:
        self.pool = pool
        self.policy = policy
        self.base_model = "tiny"
        self.prompts: list[list[int]] = []

    def generate(
        self, messages: list[dict[str, Any]], *, tools: Any = None, **_: Any
    ) -> tuple[str, list[int], list[int]]:
        ids = self.pool.encode(messages, tools=tools)["input_ids"][0].tolist()
        self.prompts.append(ids)
        reply = self.policy.invoke(_from_chat(messages))
        assert isinstance(reply, AIMessage)
        blocks = [
            "<tool_call>\n"
            + json.dumps({"name": c["name"], "arguments": c["args"]})
            + "\n</tool_call>"
            for c in reply.tool_calls
        ]
        text = "\n".join([str(reply.content), *blocks]).strip()
        return text, ids, []


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    for module in ("torch", "transformers", "peft"):
        pytest.importorskip(module, reason="the train extra is not installed (see docs/weights.md)")
    from evoharness.evolve.weights.tiny import build_tiny_model

    corpus = ['{"item_id": "AMZ-0001", "platform": "amazon", "price_cny": 12.5}'] * 10
    corpus.append("<tool_call>\n</tool_call> <tool_response>\n</tool_response> books kitchen")
    return str(build_tiny_model(tmp_path_factory.mktemp("parity") / "base", corpus))


def test_serving_prompts_are_the_training_tokens(tiny_dir: str, tmp_path: Path) -> None:
    from evoharness.evolve.weights.training import tokenize_sft
    from evoharness.sdk.serving.local import AdapterPool, LocalChatModel

    env = load_environment("shop", faults="none", seed=0)
    task = env.tasks("train")[0]
    pool = ScriptedPool(AdapterPool(tiny_dir, dtype="float32", threads=1), env.offline_model())
    store = TraceStore(tmp_path / "traces.db")
    (result,) = asyncio.run(
        run_tasks(
            env,
            [task],
            model_factory=lambda: LocalChatModel(pool=pool),
            middleware_factory=env.harness_middleware,
            tracer=Tracer(store),
            tags=["parity"],
        )
    )
    store.flush(10)
    assert result.success, result.failures  # a goodcase: it becomes an SFT row

    data = build_sft(
        LocalTraceSource(store),
        where=EpisodeFilter(tags=["parity"]),
        tools=tool_schemas(env.tools_for(task)),
        gates=Gates(),
        val_fraction=0.0,
    )
    (row,) = data.rows("train")
    assistant_turns = sum(m["role"] == "assistant" for m in row["messages"])
    assert len(pool.prompts) == assistant_turns >= 6
    ((ids, mask),) = [
        (r["input_ids"], r["assistant_masks"])
        for r in tokenize_sft([row], pool.pool.tokenizer, max_length=10**6)[0]
    ]
    decode = pool.pool.tokenizer.decode
    for prompt in pool.prompts:
        at = next((i for i, (a, b) in enumerate(zip(ids, prompt, strict=False)) if a != b), 0)
        around = slice(max(0, at - 40), at + 20)
        seen = f"served {decode(prompt[around])!r}, trained {decode(ids[around])!r}"
        assert ids[: len(prompt)] == prompt, seen  # the same ids, not just the same text
        # the reply is trained; the template opens the trained span right after
        # "<|im_start|>assistant", so only the newline the prompt ends with is in it too
        assert mask[len(prompt)] == 1 and mask[len(prompt) - 2] == 0
    store.close(5)
