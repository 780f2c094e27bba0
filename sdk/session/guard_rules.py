"""Guard-rule versions through the session door: the ``active`` rule set, pinned per session.

Evolve publishes learned output-guard rules as versions of ``guard_rules/<name>``; a session
checks its answers against the version active when it started (a promotion or rollback
reaches new sessions at once) and its trace records ``guard_rules/<name>``. Hand-written
rules stay in the harness's own ``OutputGuardMiddleware`` (``HarnessConfig.guard_rules`` or
a rules file); the door serves the learned ones beside them.
"""

from __future__ import annotations

import threading
from typing import Any

from langchain.agents.middleware import AgentMiddleware

from evoharness.harness.governance.output_guard import GuardRuleSet, OutputGuardMiddleware
from evoharness.sdk.registry.base import Registry
from evoharness.sdk.registry.guard_rules import EMPTY, GUARD_RULES, rules_of
from evoharness.sdk.rollout.controller import RolloutController
from evoharness.sdk.session._assigned import resolve_assigned
from evoharness.sdk.session.door import Resolved, SessionContext, pinned

__all__ = ["GuardRulesSource", "PinnedGuardRulesMiddleware"]


class GuardRulesSource:
    """Resolves the guard-rule version a session is checked against.

    Args:
        registry: Where the rule sets live.
        name: The ``guard_rules`` artifact (evolve's default is ``default``).
        label: The label new sessions follow.
        rollout: Consulted first: while a rule version is rolled out, a session gets its
            arm (sticky by user) and records it.
    """

    kind = GUARD_RULES

    def __init__(
        self,
        registry: Registry,
        name: str = "default",
        *,
        label: str = "active",
        rollout: RolloutController | None = None,
    ) -> None:
        self.registry = registry
        self.name = name
        self.label = label
        self.rollout = rollout
        self._sets: dict[int, GuardRuleSet] = {}  # versions are immutable: parse each once
        self._lock = threading.Lock()

    def resolve(self, context: SessionContext) -> Resolved:
        """The session's arm of the rules' running rollout (sticky by user), else the rule
        set ``label`` points at (nothing before the first one is published)."""
        return resolve_assigned(self, context, lambda version: {"value": self._rules(version)})

    def _rules(self, version: int) -> GuardRuleSet:
        with self._lock:
            rules = self._sets.get(version)
        if rules is None:
            rules = rules_of(self.registry.get(GUARD_RULES, self.name, version))
            with self._lock:
                self._sets[version] = rules
        return rules

    def middleware(self) -> AgentMiddleware[Any, Any, Any]:
        """Checks answers against the pinned rule set."""
        return PinnedGuardRulesMiddleware(self.name)


class PinnedGuardRulesMiddleware(OutputGuardMiddleware):
    """The harness's output guard, checking against the session's pinned rule set (no rules
    outside a pin or before a version is active).

    Args:
        rules_name: The ``guard_rules`` artifact whose pinned version it serves.
    """

    def __init__(self, rules_name: str) -> None:
        self.rules_name = rules_name
        super().__init__(rules_provider=self._pinned)

    @property
    def name(self) -> str:
        return f"PinnedGuardRules[{self.rules_name}]"

    def _pinned(self) -> GuardRuleSet:
        got = pinned(GUARD_RULES, self.rules_name)
        return got.value if got is not None and isinstance(got.value, GuardRuleSet) else EMPTY
