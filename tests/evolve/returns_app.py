"""A returns desk written from README and docs/evolve.md, with its own plugin and run side
(``--env returns_app:environment``), for the whole loop from the command line.

Two kinds of request, two procedures:

- refunds: ``lookup_order -> check_refund_policy -> issue_refund``;
- cancellations: ``lookup_order -> confirm_cancellation -> cancel_order``.

The model is SIMULATED, and each layer can fix exactly one thing:

- it skips the policy check unless its system prompt names ``check_refund_policy`` (what a
  learned lesson says): **memory** fixes refunds;
- it confirms a cancellation only out of habit (two orders in five), whatever its prompt
  says: memory and a prompt edit are tried and do not fix it, so evolve decides to
  **train**;
- served with an adapter of its policy it follows both procedures: the adapter's weights
  are trained (a tiny Llama) and loaded for real by the serving pool
  (:class:`~evoharness.sdk.serving.local.AdapterPool` behind ``LocalChatModel``), while
  the reply text is SIMULATED (a 100K-parameter model learns nothing useful in seconds).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import BaseTool, tool

from evoharness.evolve.environment import EnvironmentPlugin
from evoharness.evolve.episodes.traces import Episode
from evoharness.evolve.judging.rubric import ItemResult, Rubric, RubricItem
from evoharness.harness import HarnessConfig, default_middleware
from evoharness.harness.tracing import RunInfo, Tracer, TraceStore
from evoharness.sdk import EvoAgent, create_evo_agent
from evoharness.sdk.environment import Outcome
from evoharness.sdk.registry import Registry
from evoharness.sdk.serving.local import BASE, LocalChatModel
from evoharness.sdk.testing import ScriptedChatModel

TAG = "returns"
PROMPT = "returns"
POLICY = "returns-policy"
SYSTEM = "You are the returns desk. Use the tools to handle refund and cancellation requests."
SERVED: dict[str, Any] = {"base_dir": None, "pool": None}
"""The tiny base model's directory (the test sets it) and the serving pool built over it."""


@tool
def lookup_order(order_id: str) -> str:
    """Look an order up."""
    return json.dumps({"order_id": order_id, "status": "delivered"})


@tool
def check_refund_policy(order_id: str) -> str:
    """Whether an order may be refunded."""
    return json.dumps({"order_id": order_id, "refundable": True})


@tool
def issue_refund(order_id: str) -> str:
    """Refund an order."""
    return json.dumps({"order_id": order_id, "refunded": True})


@tool
def confirm_cancellation(order_id: str) -> str:
    """Ask the customer to confirm a cancellation."""
    return json.dumps({"order_id": order_id, "confirmed": True})


@tool
def cancel_order(order_id: str) -> str:
    """Cancel an order."""
    return json.dumps({"order_id": order_id, "cancelled": True})


TOOLS = [lookup_order, check_refund_policy, issue_refund, confirm_cancellation, cancel_order]


def kind_of(request: str) -> str:
    """``refund`` or ``cancel``: the app's case pattern."""
    return "refund" if "refund" in request.lower() else "cancel"


def order_of(request: str) -> str:
    found = re.search(r"\d+", request)
    return found.group() if found else "0"


def plan(system: str, request: str, adapter: bool) -> list[str]:
    """SIMULATED: the steps the model takes (see the module docstring)."""
    order = order_of(request)
    if kind_of(request) == "refund":
        careful = adapter or "check_refund_policy" in system
        return ["lookup_order", *(["check_refund_policy"] if careful else []), "issue_refund"]
    careful = adapter or int(order) % 5 < 2  # a habit: no prompt changes it
    return ["lookup_order", *(["confirm_cancellation"] if careful else []), "cancel_order"]


def next_step(system: str, request: str, done: list[str], adapter: bool) -> str | None:
    """The next tool to call (``None``: answer)."""
    return next((s for s in plan(system, request, adapter) if s not in done), None)


def _offline_policy(messages: list[BaseMessage]) -> AIMessage | str:
    system = next((str(m.content) for m in messages if isinstance(m, SystemMessage)), "")
    request = next((str(m.content) for m in messages if isinstance(m, HumanMessage)), "")
    done = [str(m.name) for m in messages if isinstance(m, ToolMessage)]
    step = next_step(system, request, done, adapter=False)
    if step is None:
        return f"Done with order {order_of(request)}."
    call = {"name": step, "args": {"order_id": order_of(request)}, "id": uuid.uuid4().hex[:8]}
    return AIMessage("", tool_calls=[{**call, "type": "tool_call"}])


class ScriptedPool:
    """The serving pool as ``LocalChatModel`` uses it: adapters are loaded into the real
    :class:`~evoharness.sdk.serving.local.AdapterPool` (and a version that is not loaded
    falls back exactly as there), the reply text is SIMULATED from the version served."""

    base_model = "tiny"

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    @property
    def adapters(self) -> dict[str, str]:
        return dict(self.pool.adapters)

    def load(self, name: str, path: str) -> None:
        self.pool.load(name, path)

    def resolve(self, version: str, previous: Sequence[str] = ()) -> tuple[str, str | None]:
        result: tuple[str, str | None] = self.pool.resolve(version, previous)
        return result

    def generate(
        self, messages: list[dict[str, Any]], *, version: str = BASE, **_: Any
    ) -> tuple[str, list[int], list[int]]:
        system = next((str(m["content"]) for m in messages if m["role"] == "system"), "")
        request = next((str(m["content"]) for m in messages if m["role"] == "user"), "")
        done = [str(m.get("name")) for m in messages if m["role"] == "tool"]
        step = next_step(system, request, done, adapter=version != BASE)
        if step is None:
            return f"Done with order {order_of(request)}.", [], []
        body = json.dumps({"name": step, "arguments": {"order_id": order_of(request)}})
        return f"<tool_call>\n{body}\n</tool_call>", [], []


def pool() -> ScriptedPool:
    """The app's serving pool (one tiny base model in memory, built on first use)."""
    if SERVED["pool"] is None:
        from evoharness.sdk.serving.local import AdapterPool

        SERVED["pool"] = ScriptedPool(
            AdapterPool(str(SERVED["base_dir"]), dtype="float32", threads=1)
        )
    served: ScriptedPool = SERVED["pool"]
    return served


@dataclass
class Serving:
    """The gate's :class:`~evoharness.evolve.weights.replay.AdapterServer` over the app's
    pool (``evoharness weights gate --serving returns_app:serving``)."""

    def load(self, name: str, path: str) -> None:
        pool().load(name, path)

    def chat_model(self, name: str | None) -> BaseChatModel:
        return LocalChatModel(pool=pool(), adapter=name or BASE)


def serving() -> Serving:
    return Serving()


def build_agent(store: TraceStore, registry: Registry) -> EvoAgent:
    """The app's agent: prompt, memory, guard rules and adapter through the session door;
    the adapter the registry activates is loaded into the pool before sessions use it."""
    return create_evo_agent(
        LocalChatModel(pool=pool()),
        TOOLS,
        system_prompt=SYSTEM,
        prompt=PROMPT,
        memory="default",
        guard_rules="default",
        adapter=POLICY,
        serving=pool(),
        registry=registry,
        middleware=default_middleware(HarnessConfig()),
        tracer=Tracer(store),
    )


def serve(agent: EvoAgent, users: Sequence[int], *, day: str = "d0") -> None:
    """One session per user: refunds for even users, cancellations for odd ones."""
    for u in users:
        verb = "refund" if u % 2 == 0 else "cancel"
        agent.invoke(
            f"Please {verb} my order {u}",
            user_id=f"user-{u}",
            thread_id=f"{day}-{u}",
            run=RunInfo(run_id=uuid.uuid4().hex, tags=[TAG]),
        )


# -- the app's evolve plugin ---------------------------------------------------------------
POLICY_CHECKED = RubricItem(
    id="policy_checked",
    priority="P1",
    weight=0.6,
    outcome="decides",
    description="The refund policy was checked before the refund",
    avoid_hint="Call check_refund_policy before issue_refund.",
)
CANCEL_CONFIRMED = RubricItem(
    id="cancel_confirmed",
    priority="P1",
    weight=0.6,
    outcome="decides",
    description="The customer confirmed before the order was cancelled",
    avoid_hint="Call confirm_cancellation before cancel_order.",
)


def judge_calls(request: str, names: list[str]) -> tuple[str, bool]:
    """The app's ground truth: (item, passed) for one run's tool calls."""
    if kind_of(request) == "refund":
        final, needed, item = "issue_refund", "check_refund_policy", POLICY_CHECKED.id
    else:
        final, needed, item = "cancel_order", "confirm_cancellation", CANCEL_CONFIRMED.id
    if final not in names:
        return item, False
    return item, needed in names[: names.index(final)]


def check_episode(e: Episode, rubric: Rubric) -> list[ItemResult]:
    item, ok = judge_calls(e.query, [c.name for c in e.tool_calls])
    return [ItemResult(id=item, priority="P1", passed=ok)]


@dataclass(frozen=True)
class Task:
    task_id: str
    request: str


SPLITS = {"train": range(1000, 1008), "val": range(2000, 2016), "guard": range(3000, 3008)}
SPLITS["test"] = range(4000, 4008)


class ReturnsRuntime:
    """The run side: frozen splits of refunds and cancellations, the tools, the checker over
    messages, the SIMULATED offline model and the app's harness."""

    name = TAG

    def __init__(self, **_: Any) -> None:
        pass

    def tasks(self, split: str) -> list[Task]:
        if split not in SPLITS:
            from evoharness.harness import ConfigError

            raise ConfigError(f"unknown split {split!r}", field="split")
        return [
            Task(f"{split}-{n}", f"Please {'refund' if n % 2 == 0 else 'cancel'} my order {n}")
            for n in SPLITS[split]
        ]

    def system_prompt(self) -> str:
        return SYSTEM

    def tools_for(self, task: Any) -> list[BaseTool]:
        return list(TOOLS)

    def check(self, task: Any, messages: Sequence[BaseMessage], error: str | None) -> Outcome:
        names = [str(c["name"]) for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
        item, ok = judge_calls(task.request, names)
        ok = ok and error is None
        return Outcome(success=ok, score=1.0 if ok else 0.0, failures=[] if ok else [item])

    def offline_model(self) -> BaseChatModel:
        return ScriptedChatModel(policy=_offline_policy, model_name="returns (simulated)")

    def harness_middleware(self) -> list[AgentMiddleware[Any, Any, Any]]:
        return default_middleware(HarnessConfig())


environment = EnvironmentPlugin(
    TAG,
    checker=check_episode,
    items=[POLICY_CHECKED, CANCEL_CONFIRMED],
    case_key=lambda query, metadata: kind_of(query),
    runtime=ReturnsRuntime,
)
"""The app's evolve plugin (with a run side: its splits can be replayed)."""
