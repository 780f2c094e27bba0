"""The refund desk as the runner sees it (tasks, tools, checker, SIMULATED offline model)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.tools import BaseTool

from evoharness.examples.desk.policy import OfflineDeskPolicy
from evoharness.examples.desk.world import DeskSession, DeskTask, check_calls, orders, tasks
from evoharness.harness import BreakerConfig, ConfigError, HarnessConfig, default_middleware
from evoharness.sdk.environment import Outcome, TaskSpec
from evoharness.sdk.testing import ScriptedChatModel

SYSTEM_PROMPT = """You are the order-support desk.
Tools: lookup_order, check_refund_policy, issue_refund, notify_customer, track_shipment.
Rules:
- Refund at most what check_refund_policy allows for the customer's reason.
- Tell the customer about every refund (notify_customer) and give them the refund id.
- For "where is my order", track the shipment and give the expected date."""


class DeskEnvironment:
    """Order support: 240 seeded orders, 5 tools, 200 frozen tasks (train/val/test).

    The checker reads what the session's tools actually did (each task's latest session).

    Args:
        seed: Seeds the payment backend's timeouts and the offline policy.
    """

    name = "desk"

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = seed
        self.book = orders()
        self.all = tasks()
        self._sessions: dict[str, DeskSession] = {}
        self._lock = threading.Lock()

    def tasks(self, split: str) -> list[DeskTask]:
        if split not in {"train", "val", "test"}:
            raise ConfigError(f"unknown split {split!r}; choose train, val or test", field="split")
        return [t for t in self.all if t.split == split]

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def tools_for(self, task: TaskSpec) -> list[BaseTool]:
        session = DeskSession(self.book, task.task_id, seed=self.seed)
        with self._lock:
            self._sessions[task.task_id] = session
        return session.tools()

    def check(self, task: TaskSpec, messages: Sequence[BaseMessage], error: str | None) -> Outcome:
        if not isinstance(task, DeskTask):
            raise ConfigError(f"expected a DeskTask, got {type(task).__name__}")
        with self._lock:
            session = self._sessions.get(task.task_id)
        last = messages[-1] if messages else None
        answer = str(last.content) if isinstance(last, AIMessage) else ""
        r = check_calls(task, session.log if session else [], answer, self.book)
        failures = [*r.failures, *(["run_error"] if error else [])]
        return Outcome(success=r.success and not error, score=r.score, failures=failures)

    def offline_model(self) -> BaseChatModel:
        return ScriptedChatModel(
            policy=OfflineDeskPolicy(seed=self.seed), model_name="offline-desk-policy (simulated)"
        )

    def harness_middleware(self) -> list[AgentMiddleware[Any, Any, Any]]:
        """The default harness, one breaker per tool."""
        config = HarnessConfig(
            breaker=BreakerConfig(
                minimum_calls=4, window_size=20, failure_rate_threshold=0.5, open_duration_s=60
            )
        )
        return default_middleware(config)
